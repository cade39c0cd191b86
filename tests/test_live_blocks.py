"""Folding the processes' iopub messages into outputs and collapsing them (pure, issue 16)."""

from __future__ import annotations

from jaxcluster.cells.live import ProcessLog, Relay, blocks
from jaxcluster.render.cell import cell_outputs

WIDGET = {"text/plain": "bar", "application/vnd.jupyter.widget-view+json": {"model_id": "m"}}


def log(*messages):
    entry = ProcessLog()
    for kind, content in messages:
        entry.apply(kind, content)
    return entry


def out(text, name="stdout"):
    return ("stream", {"name": name, "text": text})


def shown(logs, collapsed=True):
    return [(b.indices, b.text or b.output.data["text/plain"])
            for b in blocks(logs, range(len(logs)), collapsed)]


def test_a_display_on_one_process_keeps_its_place_before_shared_output():
    logs = [log(("display_data", {"data": WIDGET}), out("done\n")), log(out("done\n"))]
    assert shown(logs) == [([0], "bar"), ([0, 1], "done\n")]


def test_a_process_behind_the_others_shares_what_it_has_printed():
    logs = [log(out("a\nb\n")), log(out("a\n"))]
    assert shown(logs) == [([0, 1], "a\n"), ([0], "b\n")]


def test_differing_lines_split_and_the_rest_stays_collapsed():
    logs = [log(out(f"{word}\nend\n")) for word in ("even", "odd", "even", "odd")]
    assert shown(logs) == [([0, 2], "even\n"), ([1, 3], "odd\n"), ([0, 1, 2, 3], "end\n")]
    assert shown(logs, collapsed=False)[:2] == [([0], "even\nend\n"), ([1], "odd\nend\n")]


def test_carriage_returns_rewrite_the_line():
    logs = [log(out("  0%"), out("\r 50%"), out("\r100%\n"))]
    assert shown(logs) == [([0], "100%\n")]


def test_clear_output_waits_for_the_next_output():
    entry = log(out("old\n"), ("clear_output", {"wait": True}))
    assert [o.text for o in entry.outputs] == ["old\n"]
    entry.apply("stream", {"name": "stdout", "text": "new\n"})
    assert [o.text for o in entry.outputs] == ["new\n"]
    entry.apply("clear_output", {"wait": False})
    assert entry.outputs == []


def test_update_display_replaces_the_display_with_that_id():
    entry = log(("display_data", {"data": {"text/plain": "step 0"},
                                  "transient": {"display_id": "h"}}),
                ("update_display_data", {"data": {"text/plain": "step 3"},
                                         "transient": {"display_id": "h"}}))
    assert shown([entry]) == [([0], "step 3")]


def test_the_relay_folds_only_output_messages():
    relay = Relay(range(2))
    relay.receive(1, "stream", {"name": "stderr", "text": "w\n"})
    relay.receive(1, "comm_msg", {"data": {}})
    assert relay.drain() and relay.version == 1
    assert not relay.drain()
    assert [o.text for o in relay.logs[1].outputs] == ["w\n"]


def test_every_label_has_the_same_look():
    logs = [log(("display_data", {"data": WIDGET}), out("x\n", "stderr"))]
    items = cell_outputs(blocks(logs, [0], True), None, [0], True)
    labels = [items[0].html, items[2].html]
    assert items[0].text == "[process 0]" and items[2].text == "[process 0 stderr]\nx"
    assert all(h.startswith('<span style="color:#777;font-weight:bold">') or
               '<span style="color:#777;font-weight:bold">[process 0 stderr]' in h
               for h in labels)


def test_consecutive_text_is_one_output_and_a_display_its_own():
    logs = [log(out("a\n"), ("display_data", {"data": WIDGET}), out("b\n")),
            log(out("a\n"), out("c\n"))]
    items = cell_outputs(blocks(logs, [0, 1], True), None, [0, 1], True)
    assert [item.text or item.bundle for item in items] == [
        "[processes 0-1]\na\n[process 0]", WIDGET, "[process 0]\nb\n[process 1]\nc"]
    assert items[2].html.count('<div class="jc-stream jc-stdout">') == 2
