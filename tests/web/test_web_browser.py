"""The web page in real headless Chromium against a real server (smollm2-135m): type, send,
watch the answer stream with drafted tokens marked, hover a token, stop a long answer,
switch models, hostile HTML shown as text, an over-context conversation, and a server that
goes away. Every request the page makes stays on the server's own origin.

The tests run in file order on one server and one browser; the last one kills the server.
"""
from __future__ import annotations

import json
import re
import time

import pytest

pytest.importorskip("selenium", reason="selenium is not installed (pip install 'edgespec[test]')")
from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

from web_env import CTX, MODEL, OTHER  # noqa: E402

#: a prompt the model copies: the suffix and n-gram proposers draft most of the answer
REPETITIVE = "Repeat: a b c d e f g a b c d e f g a b c d e f g"
COUNT = "Count from 1 to 300, separated by commas: 1, 2, 3, 4, 5, 6,"
#: the model copies the tag into its answer (greedy; checked below, so a change shows)
HOSTILE = 'Repeat exactly: <img src=x onerror="document.title=1"><b>bold</b>'


def css(d, selector):
    return d.find_element(By.CSS_SELECTOR, selector)


def wait(d, seconds: float = 60.0):
    # the 2-second status refresh may replace an element between a lookup and a read
    return WebDriverWait(d, seconds, poll_frequency=0.05,
                         ignored_exceptions=(NoSuchElementException,
                                             StaleElementReferenceException))


def open_page(d, server, *, temperature: float = 0, max_tokens: int = 48) -> None:
    """A fresh page: no stored conversations; settings typed into the settings panel."""
    # cleared from another page of the origin: the chat page saves its state on unload
    d.get(server.base_url + "/web/favicon.svg")
    d.execute_script("localStorage.clear()")
    d.get(server.base_url + "/")
    wait(d, 20).until(lambda d: connection(d) == "up")
    css(d, "[data-role=settings-toggle]").click()
    for role, value in (("temperature", temperature), ("max-tokens", max_tokens)):
        field = css(d, f"[data-role={role}]")
        field.clear()
        field.send_keys(str(value), Keys.TAB)
    css(d, "[data-role=settings-toggle]").click()


def send(d, text: str) -> None:
    box = css(d, "textarea[data-role=prompt]")
    if len(text) > 200:  # typing thousands of characters is slow; the page reads .value
        d.execute_script("arguments[0].value = arguments[1]", box, text)
    else:
        box.send_keys(text)
    css(d, "[data-role=send]").click()


def last_answer(d):
    return d.find_elements(By.CSS_SELECTOR, "[data-message-role=assistant]")[-1]


def wait_done(d, seconds: float = 120.0):
    wait(d, seconds).until(lambda d: d.execute_script("return document.body.dataset.busy")
                           == "false")
    return last_answer(d)


def origins(answer) -> list[str]:
    return [e.get_attribute("data-origin")
            for e in answer.find_elements(By.CSS_SELECTOR, "[data-role=answer] [data-origin]")]


def attributes(d, selector: str, name: str) -> list[str]:
    """Read in one script call: the page re-renders parts (the legend, the connection dot) on
    its own timers, so an element found in one WebDriver call can be gone by the next."""
    return d.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.getAttribute(arguments[1]))",
        selector, name)


def connection(d) -> str | None:
    states = attributes(d, "[data-role=connection]", "data-state")
    return states[0] if states else None


def test_an_answer_streams_with_its_drafted_tokens_marked(web_server, driver):
    d = driver
    d.get_log("performance")  # only this test's requests are checked below
    open_page(d, web_server, max_tokens=96)
    send(d, REPETITIVE)
    # the answer appears piece by piece while the request runs
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state, text = d.execute_script(
            "const a = [...document.querySelectorAll('[data-message-role=assistant]')].pop();"
            "return a ? [a.dataset.state, a.querySelector('[data-role=answer]').textContent]"
            " : [null, ''];")
        if state == "streaming" and text and (not seen or seen[-1] != len(text)):
            seen.append(len(text))
        if state not in (None, "streaming"):
            break
        time.sleep(0.03)  # the server needs the CPU more than this loop
    answer = wait_done(d)
    assert answer.get_attribute("data-state") == "done"
    assert len(seen) >= 2, f"the answer did not stream (lengths seen: {seen})"
    text = css(answer, "[data-role=answer]").text
    assert "a b c d e f g" in text

    marks = origins(answer)
    drafted = [o for o in marks if o != "target"]
    assert "target" in marks and drafted, marks
    assert set(drafted) <= {"ngram", "suffix"}
    stats = css(answer, "[data-role=stats]").text
    assert "acceptance" in stats and "%" in stats and "tok/s" in stats, stats
    legend = set(attributes(d, "[data-role=legend] [data-origin]", "data-origin"))
    assert {"target", *drafted} <= legend

    # hovering a drafted token tells its pass
    token = answer.find_element(By.CSS_SELECTOR,
                                "[data-role=answer] [data-origin]:not([data-origin=target])")
    ActionChains(d).move_to_element(token).perform()
    wait(d, 5).until(lambda d: "drafted by" in css(d, "[data-role=token-info]").text)
    info = css(d, "[data-role=token-info]").text
    assert token.get_attribute("data-origin") in info and "draft position" in info
    assert token.get_attribute("title") == info

    # the server view shows the model and the /metrics counters
    server = css(d, "[data-role=server]").text
    assert MODEL in server and "acceptance" in server

    # nothing was requested from anywhere but this server
    origin = web_server.base_url
    urls = []
    for entry in d.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    assert any(u.startswith(origin + "/v1/chat/completions") for u in urls), urls
    outside = [u for u in urls if not u.startswith((origin + "/", "data:", "blob:"))]
    assert not outside, outside
    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_html_in_an_answer_is_shown_as_text_never_run(web_server, driver):
    d = driver
    open_page(d, web_server)
    send(d, HOSTILE)
    answer = wait_done(d)
    body = css(answer, "[data-role=answer]")
    # the model did write markup (greedy: it copies the <img> tag, or the <b> one)
    assert re.search(r"<(img|b)[ >]", body.text), body.text
    assert not body.find_elements(By.CSS_SELECTOR, "img, script, b, iframe, [onerror]")
    assert d.title == "edgespec"  # the onerror handler never ran
    # what the page does render is its own Markdown elements, tokens as spans
    tags = set(d.execute_script(
        "return [...arguments[0].querySelectorAll('*')].map(e => e.tagName.toLowerCase())",
        body))
    assert tags <= {"div", "p", "br", "span", "code", "pre", "strong", "em", "ul", "ol", "li",
                    "h3", "h4", "h5", "h6", "blockquote", "hr", "a", "button", "details",
                    "summary"}, tags


MARKDOWN = """# Fix

The **bug** is in `mean`: <img src=x onerror="document.title='pwned'">

- divide by `len(xs)`
- not *len - 1*

```python
def mean(xs):
    return sum(xs) / len(xs)  # <script>document.title='pwned'</script>
```
[docs](https://docs.python.org/3/) and [bad](javascript:alert(1))"""


def test_the_markdown_renderer_builds_elements_and_never_parses_html(web_server, driver):
    """The page's renderer on a fixed text (no model): structure from Markdown, every
    character from the source as text, markup never interpreted, only http(s) links."""
    d = driver
    open_page(d, web_server)
    out = d.execute_script("""
        const src = arguments[0], box = document.createElement('div');
        const text = (parent, s, e) => parent.append(document.createTextNode(src.slice(s, e)));
        for (const b of EdgespecMarkdown.parseBlocks(src, 0))
            box.append(EdgespecMarkdown.renderBlock(src, b, text));
        return [box.innerHTML, box.textContent,
                [...box.querySelectorAll('*')].map(e => e.tagName.toLowerCase()),
                [...box.querySelectorAll('a')].map(a => a.getAttribute('href'))];
    """, MARKDOWN)
    html, text, tags, links = out
    assert tags.count("li") == 2 and {"h3", "strong", "em", "pre", "code", "a"} <= set(tags)
    assert not {"img", "script"} & set(tags)
    assert "<img src=x onerror=" in text and "<script>" in text
    assert "&lt;img" in html and "&lt;script&gt;" in html
    assert links == ["https://docs.python.org/3/"]  # the javascript: link stays text
    assert "[bad](javascript:alert(1))" in text
    assert d.title == "edgespec"


#: a page-side stand-in for the chat route: a long answer (paragraphs, then a long code
#: block), streamed as fast as the page reads it, in the extension's shape
_LONG_STREAM = r"""
const n = arguments[0];
const real = window.fetch;
window.fetch = async (url, opts) => {
  if (!String(url).includes('/chat/completions')) return real(url, opts);
  const enc = new TextEncoder();
  let i = 0;
  const piece = (k) => k < n / 2 ? (k % 40 === 39 ? ' end.\n\n' : ' w' + k)
                                 : (k === Math.floor(n / 2) ? '```\n' : 'x' + k + '\n');
  const body = new ReadableStream({pull(ctrl) {
    if (i >= n) {
      ctrl.enqueue(enc.encode('data: ' + JSON.stringify({choices: [{index: 0, delta: {},
        finish_reason: 'length'}], edgespec: {drafted: n, accepted: n / 2,
        acceptance_rate: 0.5, decode_tokens_per_second: 100}}) + '\n\ndata: [DONE]\n\n'));
      ctrl.close();
      return;
    }
    let out = '';
    for (let k = 0; k < 20 && i < n; k++, i++) {
      const text = piece(i);
      out += 'data: ' + JSON.stringify({choices: [{index: 0, delta: {content: text}}],
        edgespec: {tokens: [{text: text, origin: i % 2 ? 'ngram' : 'target', drafted: 1,
                             position: 0}]}}) + '\n\n';
    }
    if (i >= n / 2 && !window.firstBlock) {  // the paragraphs are all closed by now
      window.firstBlock = document.querySelector('[data-role=answer] .md > p');
    }
    ctrl.enqueue(enc.encode(out));
    return new Promise((r) => setTimeout(r, 0));
  }});
  return new Response(body, {status: 200, headers: {'Content-Type': 'text/event-stream'}});
};
"""


def test_a_very_long_answer_renders_incrementally(web_server, driver):
    """4,000 tokens arriving as fast as the page reads them: every token gets its element,
    and a paragraph finished early is the same node at the end (blocks a later block has
    closed are rendered once, not rebuilt per frame)."""
    d = driver
    n = 4000
    open_page(d, web_server)
    d.execute_script(_LONG_STREAM, n)
    started = time.monotonic()
    send(d, "a long answer, please")
    answer = wait_done(d, 60)
    took = time.monotonic() - started
    assert answer.get_attribute("data-state") == "done"
    spans, first_kept, lines = d.execute_script(
        "const a = arguments[0].querySelector('[data-role=answer]');"
        "return [a.querySelectorAll('[data-tok]').length,"
        " !!window.firstBlock && window.firstBlock.isConnected,"
        " a.querySelector('pre code').textContent.split('\\n').length];", answer)
    assert spans >= n - 1, spans  # the fence's own token is markup, not text
    assert first_kept
    assert lines >= n // 2 - 1
    assert took < 45, f"{n} tokens took {took:.1f} s to render"


def test_stop_cancels_a_long_answer(web_server, driver):
    d = driver
    open_page(d, web_server, max_tokens=400)
    send(d, COUNT)
    wait(d).until(lambda d: len(css(last_answer(d), "[data-role=answer]").text) > 12)
    css(d, "[data-role=stop]").click()
    answer = wait_done(d, 10)
    assert answer.get_attribute("data-state") == "cancelled"
    kept = css(answer, "[data-role=answer]").text
    time.sleep(1.0)
    assert css(last_answer(d), "[data-role=answer]").text == kept  # nothing arrives after
    assert kept and "stopped" in css(answer, "[data-role=stats]").text
    # the server freed the sequence: the page's disconnect cancelled the request
    assert web_server.wait_idle(15)["running"] == 0
    assert css(d, "[data-role=send]").is_displayed()


def test_switching_models(web_server, driver):
    d = driver
    open_page(d, web_server)
    picker = Select(css(d, "select[data-role=model]"))
    assert {o.get_attribute("value") for o in picker.options} == {MODEL, OTHER}
    assert picker.first_selected_option.get_attribute("value") == MODEL
    picker.select_by_value(OTHER)
    send(d, "Say hello.")
    answer = wait_done(d, 180)  # the second model loads on this first request
    assert answer.get_attribute("data-state") == "done", css(answer, "[data-role=error]").text
    assert css(answer, ".who").text.startswith(OTHER)
    assert OTHER in css(answer, "[data-role=stats]").text
    status, _, body = web_server.request("GET", "/v1/edgespec/status")
    states = {m["id"]: m["state"] for m in json.loads(body)["models"]}
    assert states[OTHER] == "loaded"
    # the choice belongs to the conversation and survives a reload
    d.refresh()
    wait(d, 20).until(lambda d: Select(css(d, "select[data-role=model]"))
                      .first_selected_option.get_attribute("value") == OTHER)


def test_the_proposer_switch_runs_a_request_on_the_plain_path(web_server, driver):
    d = driver
    open_page(d, web_server)
    picker = Select(css(d, "select[data-role=proposer]"))
    assert css(d, "select[data-role=proposer]").is_enabled()
    values = [o.get_attribute("value") for o in picker.options]
    assert values == ["", "none", "ngram", "suffix"]  # "": the model's own (ngram+suffix)
    assert "ngram+suffix" in picker.options[0].text
    picker.select_by_value("none")
    send(d, REPETITIVE)
    answer = wait_done(d)
    assert answer.get_attribute("data-state") == "done"
    assert set(origins(answer)) == {"target"}
    stats = css(answer, "[data-role=stats]").text
    assert "nothing drafted" in stats and "proposer none" in stats, stats
    # --exact is the server's: shown, not switchable per request
    assert not css(d, "[data-role=exact]").is_enabled()


def test_a_proposer_the_model_has_not_loaded_is_refused(web_server):
    status, _, body = web_server.request("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
        "proposer": "draft"})
    assert status == 400
    assert "proposer 'draft' is not loaded" in json.loads(body)["error"]["message"]


def test_an_over_context_conversation_shows_the_error_and_keeps_it(web_server, driver):
    d = driver
    open_page(d, web_server)
    long = "word " * (2 * CTX)
    send(d, long)
    answer = wait_done(d)
    assert answer.get_attribute("data-state") == "error"
    error = css(answer, "[data-role=error]").text
    assert "context" in error and str(CTX) in error, error
    # the conversation is kept, in the page and across a reload
    d.refresh()
    wait(d, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-role=user-text]"))
    assert css(d, "[data-role=user-text]").text.strip() == long.strip()
    assert "context" in css(d, "[data-role=error]").text
    assert len(d.find_elements(By.CSS_SELECTOR, "[data-role=conversation]")) == 1
    # deleting the long message lets the conversation go on
    user = css(d, "[data-message-role=user]")
    ActionChains(d).move_to_element(user).perform()
    css(user, "[data-role=delete-message]").click()
    send(d, REPETITIVE)
    answer = wait_done(d)
    assert answer.get_attribute("data-state") == "done"


def test_conversations_are_kept_renamed_exported_and_deleted(web_server, driver):
    d = driver
    open_page(d, web_server, max_tokens=8)
    send(d, "Hi")
    wait_done(d)
    css(d, "[data-role=new-conversation]").click()
    items = d.find_elements(By.CSS_SELECTOR, "[data-role=conversation]")
    assert len(items) == 2 and not d.find_elements(By.CSS_SELECTOR, "[data-role=message]")
    old = items[1]
    ActionChains(d).move_to_element(old).perform()
    old.find_element(By.CSS_SELECTOR, "[data-action=rename]").click()
    field = css(d, "[data-role=rename-input]")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys("<i>greeting</i>", Keys.ENTER)
    titles = [e.text for e in d.find_elements(By.CSS_SELECTOR, "[data-role=conversation] .title")]
    assert "<i>greeting</i>" in titles  # a title is text too
    stored = json.loads(d.execute_script(
        "return localStorage.getItem('edgespec.web.conversations')"))
    greeting = next(c for c in stored if c["title"] == "<i>greeting</i>")
    assert [m["role"] for m in greeting["messages"]] == ["user", "assistant"]
    assert greeting["messages"][1]["tokens"]  # the origins are kept with the text
    # export: the conversation as JSON, handed to the browser as a download
    d.execute_script("URL.createObjectURL = (blob) => { window.exported = blob; "
                     "return 'blob:exported'; };")
    item = next(e for e in d.find_elements(By.CSS_SELECTOR, "[data-role=conversation]")
                if "greeting" in e.text)
    ActionChains(d).move_to_element(item).perform()
    item.find_element(By.CSS_SELECTOR, "[data-action=export]").click()
    exported = json.loads(d.execute_async_script(
        "window.exported.text().then(arguments[arguments.length - 1])"))
    assert exported["title"] == "<i>greeting</i>" and exported["messages"] == greeting["messages"]
    # delete asks once more, then removes it from the page and the storage
    d.refresh()
    wait(d, 20).until(lambda d: len(d.find_elements(By.CSS_SELECTOR,
                                                    "[data-role=conversation]")) == 2)
    item = next(e for e in d.find_elements(By.CSS_SELECTOR, "[data-role=conversation]")
                if "greeting" in e.text)
    ActionChains(d).move_to_element(item).perform()
    button = item.find_element(By.CSS_SELECTOR, "[data-action=delete]")
    button.click()
    assert button.text == "delete?"
    button.click()
    assert len(d.find_elements(By.CSS_SELECTOR, "[data-role=conversation]")) == 1
    stored = json.loads(d.execute_script(
        "return localStorage.getItem('edgespec.web.conversations')"))
    assert [c["title"] for c in stored] != ["<i>greeting</i>"] and len(stored) == 1


def test_a_server_that_goes_away_is_reported_and_the_answer_kept(web_server, driver):
    """Last: it kills the server. Mid-stream, the page keeps the text so far and says the
    connection was lost; afterwards a send says the server cannot be reached."""
    d = driver
    open_page(d, web_server, max_tokens=400)
    send(d, COUNT)
    wait(d).until(lambda d: len(css(last_answer(d), "[data-role=answer]").text) > 12)
    web_server.kill()
    answer = wait_done(d, 20)
    assert answer.get_attribute("data-state") == "error"
    assert css(answer, "[data-role=answer]").text  # the text so far is kept
    assert "lost" in css(answer, "[data-role=error]").text
    banner = css(d, "[data-role=banner]")
    assert banner.is_displayed() and css(d, "[data-role=banner-retry]").is_displayed()
    send(d, "Are you there?")
    answer = wait_done(d, 20)
    assert "Cannot reach the server" in css(answer, "[data-role=error]").text
    wait(d, 10).until(lambda d: connection(d) == "down")
    assert len(d.find_elements(By.CSS_SELECTOR, "[data-message-role=user]")) == 2
