"""Writes tests/fuzz/metrics_corpus.jsonl: hostile replies to the operator's metrics reads (issue 13).

Each line: {"kind": "stats" | "prometheus" | "matrix", "body": <the raw reply text>, "note": why it is hostile},
where a huge body is written as "repeat": [prefix, unit, times, suffix] and a body that is not UTF-8 carries
"encoding": "latin-1" (the bytes sent are body.encode(encoding)).
Run `python -m tests.fuzz.make_metrics_corpus` to regenerate; the corpus is committed so the test is stable.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("metrics_corpus.jsonl")
GOOD = {"numActiveRequests": 3, "numQueuedRequests": 1, "maxBatchSizeStatic": 64, "maxBatchSizeRuntime": 16,
        "iterLatencyMS": 7.0, "numCompletedRequests": 1,
        "kvCacheStats": {"usedNumBlocks": 10, "maxNumBlocks": 100, "tokensPerBlock": 32},
        "inflightBatchingStats": {"numPausedRequests": 0, "numContextRequests": 1, "numGenRequests": 2}}
ODD_VALUES = [True, False, "1", "", [], [1], {}, {"a": 1}, -1, -0.5, 1.5, 1e300, 2**63, 2**64 + 1,
              float("inf"), float("-inf"), float("nan")]


def stats_cases() -> list[tuple[object, str]]:
    out: list[tuple[object, str]] = []

    def dump(obj: object) -> str:
        return json.dumps(obj, allow_nan=True)

    for field in ("numActiveRequests", "maxBatchSizeStatic", "iterLatencyMS", "numCompletedRequests", "iter"):
        for v in ODD_VALUES:
            if field == "iterLatencyMS" and v == 1.5:
                continue  # a fractional latency is legitimate
            out.append((dump([{**GOOD, field: v}]), f"{field}={v!r}"))
    for section, key in (("kvCacheStats", "usedNumBlocks"), ("kvCacheStats", "maxNumBlocks"),
                         ("inflightBatchingStats", "numPausedRequests"), ("inflightBatchingStats", "numCtxTokens"),
                         ("kvCacheStats", "reusedBlocks")):
        for v in ("x", [1], -3, float("inf"), 1.25, {}):
            out.append((dump([{**GOOD, section: {**GOOD[section], key: v}}]), f"{section}.{key}={v!r}"))  # type: ignore[dict-item]
    for v in (1, "x", [1], True, 0.5):
        out.append((dump([{**GOOD, "kvCacheStats": v}]), f"kvCacheStats={v!r}"))
        out.append((dump([{**GOOD, "inflightBatchingStats": v}]), f"inflightBatchingStats={v!r}"))
    out += [
        (dump([{"kvCacheStats": 1}]), "issue 13's first example"),
        (dump([{**GOOD, "iterLatencyMS": [1]}]), "issue 13's second example"),
        ("{}", "an object, not a list"), ('{"detail": "Not Found"}', "FastAPI 404 body"), ("null", "null"),
        ("5", "a number"), ('"[]"', "a string"), ("[1, 2, 3]", "numbers in the list"), ("[[]]", "a nested list"),
        ("[null]", "a null item"), ("", "empty body"), ("[", "truncated"), ("[{]", "bad syntax"),
        (("latin-1", "[\xff\xfe]"), "not UTF-8 text"), ("[NaN]", "a NaN literal"), ("[Infinity]", "an Infinity literal"),
        (("repeat", ["", "[", 100_000, "]" * 100_000]), "nesting deep enough to exhaust recursion"),
        (("repeat", ["[", dump(GOOD) + ",", 20_001, dump(GOOD) + "]"]), "more iterations than any server keeps"),
        (("repeat", ["[", "0,", 5_000_000, "0]"]), "a 10 MB reply"),
        (dump([{**GOOD, "kvCacheStats": {"usedNumBlocks": 900, "maxNumBlocks": 100, "tokensPerBlock": 32}}]),
         "used > max blocks (utilization 9.0)"),
        (dump([{**GOOD, "kvCacheStats": {**GOOD["kvCacheStats"], "tokensPerBlock": 64}}]),  # type: ignore[dict-item]
         "another engine's tokensPerBlock"),
        (dump([{**GOOD, "maxBatchSizeStatic": 512}]), "a static batch size above the engine's ceiling"),
        ("<html>502 Bad Gateway</html>", "a proxy's error page"),
    ]
    return out


def prometheus_cases() -> list[tuple[object, str]]:
    hist = ("# TYPE time_to_first_token_seconds histogram\n"
            'time_to_first_token_seconds_bucket{{le="{le}"}} {v}\ntime_to_first_token_seconds_count 1\n')
    return [
        ("Not Found", "a 404 body"), ("# TYPE x gauge\nx{a=\"1\"} NaN\n", "NaN gauge"),
        ("# TYPE x gauge\nx +Inf\n", "infinite gauge"), ("x{le=}\n", "bad labels"),
        (hist.format(le="abc", v=1), "bucket bound not a number"), (hist.format(le="1", v="+Inf"), "infinite bucket"),
        ("# TYPE x histogram\nx_bucket 1\n", "bucket without le"), ("\x00\x01\x02", "binary"),
        ("x " + "9" * 5000 + "\n", "a huge number"), (("repeat", ["", "a 1\n", 60_000, ""]), "too many samples"),
        ('# TYPE request_success_total counter\nrequest_success_total{finished_reason="stop"} -5\n', "negative counter"),
    ]


def matrix_cases() -> list[tuple[object, str]]:
    """Answers to the Prometheus source's range query (observe/prometheus.py)."""
    def v(result: object) -> str:  # one series' "value" becomes that series' only point
        if isinstance(result, list):
            result = [{**r, "values": [r["value"]]} if isinstance(r, dict) and "value" in r else r for r in result]
        return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})

    return [
        ("[]", "a top-level list"), ("null", "null"), ('{"status": "error", "error": "bad query"}', "query error"),
        ('{"status": "success"}', "no data"), ('{"status": "success", "data": []}', "data as a list"),
        (v(None), "result null"), (v([None]), "a null series"), (v([{"metric": {"pod": "p"}, "value": None}]), "value null"),
        (v([{"metric": {"pod": "p"}, "value": [1, None]}]), "value[1] null"),
        (v([{"metric": {"pod": "p"}, "value": [1, "NaN"]}]), "NaN value"),
        (v([{"metric": {"pod": "p"}, "value": [1, "+Inf"]}]), "infinite value"),
        (v([{"metric": {"pod": "p"}, "value": [1, "x"]}]), "not a number"),
        (v([{"metric": {"pod": 5}, "value": [1, "1"]}]), "pod not a string"),
        (v([{"metric": "p", "value": [1, "1"]}]), "metric not an object"),
        (v([{"metric": {"pod": "p"}, "value": [1, 1]}]), "value[1] a JSON number"),
        (v([{"metric": {"pod": "p"}, "value": [1]}]), "value too short"),
        (v([{"metric": {"pod": "p"}, "value": [None, "1"]}]), "timestamp null"),
        (v([{"metric": {"pod": "p"}, "values": None}]), "values null"),
        (json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}), "a vector, not a matrix"),
        (v([{"metric": {"pod": "p"}, "value": [1, "1e300"]}]), "an absurd value"),
    ]


def load(path: Path = OUT) -> list[dict[str, object]]:
    """The corpus with every body expanded to the bytes a pod would send."""
    out = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if "repeat" in entry:
            prefix, unit, times, suffix = entry["repeat"]
            text = prefix + unit * times + suffix
        else:
            text = entry["body"]
        entry["bytes"] = text.encode(entry.get("encoding", "utf-8"))
        out.append(entry)
    return out


def main() -> None:
    lines = []
    for kind, cases in (("stats", stats_cases()), ("prometheus", prometheus_cases()), ("matrix", matrix_cases())):
        for body, note in cases:
            entry: dict[str, object] = {"kind": kind, "note": note}
            if isinstance(body, tuple) and body[0] == "repeat":
                entry["repeat"] = body[1]
            elif isinstance(body, tuple):
                entry["encoding"], entry["body"] = body
            else:
                entry["body"] = body
            lines.append(json.dumps(entry))
    OUT.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} payloads -> {OUT}")


if __name__ == "__main__":
    main()

