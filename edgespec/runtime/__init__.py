"""The llama.cpp boundary: the model and context, and what the machine and build can do.

    backend.py      the ONLY llama_cpp importer: the library's init, log, aborts, build facts;
                    the modules below call llama.cpp through it
    model.py        Model (vocabulary, chat template, new contexts) and load_model
    context.py      Context: batched decode, KV sequences, draft trees; the decode guards
    grammar_binding.py  llama.cpp's grammar sampler and parser verdict
    mtp.py          the MTP context of a target's NextN head; the tap of the target's hidden rows
    ggml_devices.py the backend-device registry: devices, RPC servers as devices
    kernel.py       KernelConfig: how llama.cpp computes (repack, flash attention, KV type)
    llama_build.py  the build's CMake flags and features against the machine (`edgespec doctor`)
    device.py       what this machine offers (CPU, memory, accelerators)
    rpc.py          llama.cpp RPC servers: endpoints, probes, placement
    netaddr.py      host:port parsing
    native.py       the native extension's glue: token coercion, cache-file formats
    gguf_header.py  a GGUF file's header read without llama.cpp; gguf_facts.py what it says
"""
