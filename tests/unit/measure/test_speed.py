"""The speed calibration up derives routes from: the order of the requests alone (pure), and a
run against two stub tiers of different speeds on 127.0.0.1."""

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from measure.prompts import corpus_texts
from measure.serving_stats import RequestResult
from measure.speed import SpeedOptions, TierSpeed, alone_order, measure_tiers, samples
from tests.servers import ServerThread
from tests.unit.measure.conftest import MODEL, StubServer


def test_every_tier_gets_a_prompt_before_any_gets_the_next_and_the_first_rotates() -> None:
    order = alone_order(["fp16", "int8", "int4"], 4)
    assert [i for i, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [name for i, name in order if i == 0] == ["fp16", "int8", "int4"]
    assert [name for i, name in order if i == 1] == ["int8", "int4", "fp16"]
    assert [name for i, name in order if i == 3] == ["fp16", "int8", "int4"]
    firsts = [order[3 * i][1] for i in range(3)]
    assert sorted(firsts) == ["fp16", "int4", "int8"]  # each tier leads once in three rounds
    assert alone_order([], 3) == []


@pytest.fixture
def two_tiers() -> Iterator[dict[str, StubServer]]:
    servers = {"fast": StubServer(), "slow": StubServer()}
    threads = []
    for server in servers.values():
        thread = ServerThread(server.app)
        thread.start()
        server.url = thread.url
        threads.append(thread)
    yield servers
    for thread in threads:
        thread.stop()


def test_the_slower_tier_measures_slower_and_the_requests_alone_interleave(
    two_tiers: dict[str, StubServer], tmp_path: Path
) -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus_texts()[:100], trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    two_tiers["fast"].gap, two_tiers["slow"].gap = 0.005, 0.03
    opts = SpeedOptions(input_len=16, output_len=4, requests=3, concurrency=2)
    urls = {name: server.url for name, server in two_tiers.items()}
    speeds = asyncio.run(measure_tiers(urls, MODEL, tmp_path, opts))
    assert speeds["slow"].tpot_s > 2 * speeds["fast"].tpot_s > 0
    assert speeds["fast"].throughput_tok_s > speeds["slow"].throughput_tok_s
    assert speeds["fast"].failed == speeds["slow"].failed == 0
    # The samples alone, one per prompt in prompt order: paired, the slow tier slower on each.
    for fast, slow in zip(speeds["fast"].tpots_s, speeds["slow"].tpots_s, strict=True):
        assert fast is not None and slow is not None and slow > 2 * fast
    assert len(speeds["slow"].ttfts_s) == 3 and None not in speeds["slow"].ttfts_s
    # warm-up (1) + 3 alone + 3 loaded each, the same prompts alone to both (alone_order).
    for server in two_tiers.values():
        assert len(server.bodies) == 7
        assert [b["prompt"] for b in server.bodies[1:4]] == [
            b["prompt"] for b in two_tiers["fast"].bodies[1:4]
        ]


def test_each_request_alone_gives_its_ttft_and_tpot_and_a_failure_none() -> None:
    results = [
        RequestResult(0.0, True, output_tokens=5, ttft=0.2, latency=0.6),
        RequestResult(0.0, False, error="boom"),
        RequestResult(0.0, True, output_tokens=1, ttft=0.3, latency=0.3),
    ]
    ttfts, tpots = samples(results)
    assert ttfts == [0.2, None, 0.3]
    assert tpots[0] is not None and abs(tpots[0] - 0.1) < 1e-9
    assert tpots[1:] == [None, None]  # one token has no time per output token


def test_speeds_round_trip_through_the_verdict_cache_and_old_entries_load() -> None:
    speed = TierSpeed("int8", 0.2, 0.03, 30.0, 4, ttfts_s=(0.2, None), tpots_s=(0.03, 0.031))
    back = TierSpeed.from_json(json.loads(json.dumps(dataclasses.asdict(speed))))
    assert back == speed
    old = {"tier": "fp16", "ttft_s": 0.2, "tpot_s": 0.03, "throughput_tok_s": 30.0}
    assert TierSpeed.from_json({**old, "concurrency": 4}).ttfts_s == ()
    with pytest.raises(TypeError):
        TierSpeed.from_json({**old, "concurrency": 4, "tpots_s": 0.03})
