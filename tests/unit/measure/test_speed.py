"""The speed calibration up derives routes from: the order of the requests alone (pure), and a
run against two stub tiers of different speeds on 127.0.0.1."""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from measure.prompts import corpus_texts
from measure.speed import SpeedOptions, alone_order, measure_tiers
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
    # warm-up (1) + 3 alone + 3 loaded each, the same prompts alone to both (alone_order).
    for server in two_tiers.values():
        assert len(server.bodies) == 7
        assert [b["prompt"] for b in server.bodies[1:4]] == [
            b["prompt"] for b in two_tiers["fast"].bodies[1:4]
        ]
