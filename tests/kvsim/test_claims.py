"""The three claims in quick mode: the directions the docs report must hold (numbers are in docs/kvsim)."""

from __future__ import annotations

import json

from kvsim.claims import write_claims


def test_claims_quick(tmp_path):
    data = write_claims(tmp_path, quick=True)
    for name in ("claims.json", "claims.md", "claim1_static_vs_inflight.svg", "claim2_contiguous_vs_paged.svg",
                 "claim3_block_size.svg"):
        assert (tmp_path / name).exists(), name
    assert json.loads((tmp_path / "claims.json").read_text()).keys() == {"claim1", "claim2", "claim3"}
    assert (tmp_path / "claim1_static_vs_inflight.svg").read_text().lstrip().startswith("<?xml")

    c1 = data["claim1"]
    inflight, static = c1["curves"].values()
    at20 = {p["offeredRps"]: p for p in inflight}[20], {p["offeredRps"]: p for p in static}[20]
    assert at20[0]["goodputRps"] > 5 * at20[1]["goodputRps"]
    sat = list(c1["saturated"].values())
    assert sat[0]["throughputTokS"] > 2 * sat[1]["throughputTokS"]

    for group in data["claim2"]["workloads"].values():
        contiguous, no_evict, max_util = group["variants"].values()
        assert contiguous["meanRunning"] < no_evict["meanRunning"] < max_util["meanRunning"]
        assert contiguous["tokenStatesPerReserved"] < 0.25
        assert max_util["tokenStatesPerReserved"] > 0.9
        assert no_evict["tokenStatesPerAllocated"] > 0.9

    for scenario in data["claim3"]["scenarios"].values():
        rows = scenario["rows"]
        frag = [r["internalFragmentation"] for r in rows]
        assert frag == sorted(frag) and frag[-1] > 0.15 > frag[0]
        reads = [r["kvReadTimeRelative"] for r in rows]
        assert reads == sorted(reads, reverse=True)
    binds = data["claim3"]["scenarios"]["pool binds (16384 tokens)"]
    sizes = [r["tokensPerBlock"] for r in binds["rows"]]
    assert min(sizes) < binds["bestTokensPerBlock"] < max(sizes)  # the trade-off has an interior optimum
