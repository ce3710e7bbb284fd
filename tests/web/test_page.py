"""The page at / in a real headless Chromium against `shardlm serve --ranks 2`:
chat with a streamed reply, the cluster's rank rows, the same behind
--api-key, and the page's Markdown renderer and highlighter."""

import json
import time
import urllib.request

import pytest

pytest.importorskip("selenium", reason="selenium is not installed (pip install selenium)")

from conftest import API_KEY  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def role(name):
    return (By.CSS_SELECTOR, f'[data-role="{name}"]')


def chat_once(browser, shot, text="Say hello."):
    wait = WebDriverWait(browser, 120)
    box = wait.until(EC.element_to_be_clickable(role("chat-input")))
    box.send_keys(text)
    shot("typed")
    browser.find_element(*role("send")).click()
    # The reply streams into one assistant message; done once the stream ends.
    # (Nodes are re-rendered while streaming: read them in one script each time.)
    seen_partial = []

    def finished(d):
        m = d.execute_script(
            "const m = [...document.querySelectorAll('[data-role=message-assistant]')].pop();"
            "return m && [m.dataset.done || '', m.querySelector('.body').innerText,"
            " m.querySelector('[data-role=message-stats]').innerText];")
        if m and m[0] != "true" and m[1]:
            seen_partial.append(m[1])
        return m if m and m[0] == "true" else None

    _, body, stats = wait.until(finished)
    shot("replied")
    assert body.strip(), "the assistant message is empty; stats: " + stats
    assert "TTFT" in stats and "tok/s" in stats and "from cache" in stats, stats
    assert "error" not in stats, stats
    return body


def rank_rows(browser, n):
    wait = WebDriverWait(browser, 30)
    read = ("return [...document.querySelectorAll('[data-role=rank]')].map(r => [r.dataset.rank,"
            " r.querySelector('[data-role=rank-layers]').innerText,"
            " r.querySelector('[data-role=rank-memory]').innerText])")
    rows = wait.until(lambda d: (lambda v: v if len(v) == n else None)(d.execute_script(read)))
    for _, layers, memory in rows:
        assert "–" in layers and "weights" in memory and "GiB" in memory, (layers, memory)
    return rows


def power_cells(browser, cluster):
    """Each rank row's power cell: live watts with prefill and decode where the
    rank reads power, else "not readable" (this VM reads none); and the
    cluster's power line."""
    n = len(cluster["ranks"])
    read = ("return [...document.querySelectorAll('[data-role=rank]')]"
            ".map(r => r.querySelector('[data-role=rank-power]').innerText)")
    cells = WebDriverWait(browser, 30).until(
        lambda d: (lambda v: v if len(v) == n and all(v) else None)(d.execute_script(read)))
    for cell, r in zip(cells, cluster["ranks"]):
        p = r["power"]
        if p["readable"]:
            assert " W" in cell or "waiting for a reading" in cell, cell
            assert "prefill" in cell and "decode" in cell, cell
        else:
            assert cell.strip() == "not readable", cell
            assert p["reason"], p
    line = browser.find_element(*role("cluster-power")).text
    if any(h["readable"] for h in cluster["power"]["hosts"]):
        assert "prefill" in line and "decode" in line, line
    else:
        assert line == "not readable on any host", line
    return cells


def fetch_cluster(base, key=None):
    req = urllib.request.Request(base + "/cluster")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def test_chat_streams_and_cluster_shows_every_rank(server, browser, shot):
    browser.get(server.base + "/")
    shot("loaded")
    world = fetch_cluster(server.base)["world_size"]
    rows = rank_rows(browser, world)
    assert [r[0] for r in rows] == [str(i) for i in range(world)]
    power_cells(browser, fetch_cluster(server.base))
    shot("power")
    chat_once(browser, shot)
    # After a request the cells still show each rank's power (live, from the pings).
    time.sleep(2.5)
    power_cells(browser, fetch_cluster(server.base))
    shot("power-after")
    # The conversation is kept in the browser: a reload shows it again.
    browser.refresh()
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(*role("message-assistant")))
    shot("reloaded")


def test_page_behind_api_key(keyed_server, browser, shot):
    browser.get(keyed_server.base + "/")
    dialog = WebDriverWait(browser, 30).until(EC.visibility_of_element_located(role("api-key-dialog")))
    shot("asks-key")
    dialog.find_element(*role("api-key")).send_keys(API_KEY)
    dialog.find_element(*role("api-key-save")).click()
    world = fetch_cluster(keyed_server.base, API_KEY)["world_size"]
    rank_rows(browser, world)
    chat_once(browser, shot)
    assert browser.execute_script("return localStorage.getItem('shardlm.apiKey')") == API_KEY


def test_markdown_and_highlighting(server, browser):
    browser.get(server.base + "/")
    r = lambda src: browser.execute_script("return ShardMd.render(arguments[0])", src)
    assert r("# T\n\nsome **bold** and *it* and `x<y`") == \
        "<h1>T</h1><p>some <strong>bold</strong> and <em>it</em> and <code>x&lt;y</code></p>"
    code = r("```python\nif x: # note\n    return 'a'\n```")
    assert '<pre><code class="language-python">' in code
    assert '<span class="hl-kw">if</span>' in code and '<span class="hl-com"># note</span>' in code
    assert '<span class="hl-str">\'a\'</span>' in code
    # Model output never becomes markup, and links are http(s)/mailto only.
    assert "<script>" not in r("<script>alert(1)</script>")
    assert "href" not in r("[x](javascript:alert(1))")
    assert '<a href="https://e.org/"' in r("[x](https://e.org/)")
    assert r("- a\n- b") == "<ul><li>a</li><li>b</li></ul>"
    assert r("2. a\n3. b") == '<ol start="2"><li>a</li><li>b</li></ol>'
    assert "<table>" in r("| a | b |\n|---|---|\n| 1 | 2 |")
    # An unfinished fence (a reply still streaming) renders as code.
    assert r("```rust\nfn main() {").startswith('<pre><code class="language-rust"><span class="hl-kw">fn</span>')


def last_assistant(browser):
    return browser.execute_script(
        "const m = [...document.querySelectorAll('[data-role=message-assistant]')];"
        "const l = m.pop(); return l && [m.length + 1, l.dataset.done || '',"
        " l.querySelector('[data-role=message-stats]').innerText];")


def test_regenerate_edit_and_stop(server, browser, shot):
    browser.get(server.base + "/")
    browser.execute_script("localStorage.clear()")
    browser.refresh()
    chat_once(browser, shot, "Name a colour.")
    wait = WebDriverWait(browser, 120)
    browser.find_element(*role("regenerate")).click()
    wait.until(lambda d: (lambda v: v if v and v[1] == "true" and "TTFT" in v[2] else None)(last_assistant(d)))
    assert last_assistant(browser)[0] == 1, "regenerate replaces the reply"
    browser.find_element(*role("edit")).click()
    edit = browser.find_element(*role("edit-input"))
    edit.clear()
    edit.send_keys("Name a fruit.")
    browser.find_element(*role("edit-save")).click()
    wait.until(lambda d: (lambda v: v if v and v[1] == "true" and "TTFT" in v[2] else None)(last_assistant(d)))
    users = browser.execute_script(
        "return [...document.querySelectorAll('[data-role=message-user] .body')].map(e => e.innerText)")
    assert users == ["Name a fruit."], users
    shot("edited")
    # A long reply, stopped: it ends at once and says so.
    browser.find_element(By.CSS_SELECTOR, '[data-role="settings"] summary').click()
    mt = browser.find_element(*role("max-tokens"))
    mt.clear()
    mt.send_keys("2000")
    browser.find_element(*role("chat-input")).send_keys("Write a long story.")
    browser.find_element(*role("send")).click()
    stop = wait.until(EC.element_to_be_clickable(role("stop")))
    stop.click()
    v = WebDriverWait(browser, 20).until(lambda d: (lambda v: v if v and v[1] == "true" else None)(last_assistant(d)))
    assert "stopped" in v[2], v
    shot("stopped")
