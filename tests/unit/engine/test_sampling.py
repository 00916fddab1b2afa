from __future__ import annotations

import pytest
import torch

from swarmrl.services.engine.sampling import SamplingParams, draw, sample

VOCAB = 50


def test_defaults_and_aliases_follow_sglang() -> None:
    p = SamplingParams.from_dict({"sampling_seed": 7, "stop": "###", "n": 1, "frequency_penalty": 0.0}, VOCAB)
    assert (p.max_new_tokens, p.temperature, p.top_p, p.top_k) == (128, 1.0, 1.0, -1)
    assert p.seed == 7 and p.stop == ["###"]
    assert SamplingParams.from_dict(None, VOCAB) == SamplingParams()
    assert SamplingParams.from_dict({"temperature": 0}, VOCAB).greedy


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"temprature": 1.0}, "unknown sampling params ['temprature']"),
        ({"frequency_penalty": 0.5}, "frequency_penalty=0.5 is not supported"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_k": 0}, "top_k must be -1"),
        ({"temperature": -1}, "temperature must be >= 0"),
        ({"max_new_tokens": -3}, "max_new_tokens must be an int >= 0"),
        ({"stop_token_ids": [3, VOCAB]}, f"stop_token_ids [{VOCAB}] outside the vocabulary"),
        ({"stop": ["ok", ""]}, "stop must be a non-empty string"),
    ],
)
def test_invalid_params_name_the_offender(raw: dict, needle: str) -> None:
    with pytest.raises(ValueError) as err:
        SamplingParams.from_dict(raw, VOCAB)
    assert needle in str(err.value)


def test_greedy_takes_argmax_with_untempered_logprob() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    greedy = SamplingParams(temperature=0.0)
    tokens, lps = sample(logits, [greedy] * 3, [None] * 3)
    assert tokens == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1)[torch.arange(3), torch.tensor(tokens)]
    torch.testing.assert_close(torch.tensor(lps), expected)


def test_logprob_is_tempered_and_unfiltered() -> None:
    """SGLang's default: log_softmax(logits / T) at the sampled token, before top-k/top-p."""
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(1))
    p = SamplingParams(temperature=0.5, top_k=3, top_p=0.8)
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    tokens, lps = sample(logits, [p] * 4, gens)
    full = torch.log_softmax(logits / 0.5, -1)
    torch.testing.assert_close(torch.tensor(lps), full[torch.arange(4), torch.tensor(tokens)])
    top3 = logits.topk(3, dim=-1).indices
    assert all(t in top3[i].tolist() for i, t in enumerate(tokens))


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(200, 1)
    p = SamplingParams(top_p=0.7)  # 0.5 < 0.7 <= 0.8: tokens 0 and 1 stay
    tokens, _ = sample(logits, [p] * 200, [torch.Generator().manual_seed(0)] * 200)
    assert set(tokens) == {0, 1}


def test_seeded_sampling_repeats() -> None:
    logits = torch.zeros(1, VOCAB)
    p = SamplingParams(temperature=1.0)
    runs = [
        [sample(logits, [p], [g])[0][0] for _ in range(20)]
        for g in (torch.Generator().manual_seed(5), torch.Generator().manual_seed(5))
    ]
    assert runs[0] == runs[1] and len(set(runs[0])) > 1


def test_unseeded_rows_draw_together_from_the_shared_generator_and_seeded_rows_alone() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(4000, 1)
    plain, top2 = SamplingParams(), SamplingParams(top_k=2)
    params = [plain if i % 2 else top2 for i in range(4000)]
    tokens, lps = sample(logits, params, [None] * 4000, torch.Generator().manual_seed(0))
    again, _ = sample(logits, params, [None] * 4000, torch.Generator().manual_seed(0))
    assert tokens == again  # one draw from the shared generator decides them all
    torch.testing.assert_close(torch.tensor(lps), probs.log()[torch.tensor(tokens)])
    odd = torch.bincount(torch.tensor(tokens[1::2]), minlength=4) / 2000
    torch.testing.assert_close(odd, probs, atol=0.04, rtol=0)  # each row its own distribution
    assert set(tokens[::2]) == {0, 1}
    # a seeded row's token does not depend on the rows beside it
    seeded = [sample(logits[:n], [plain] * n, [None] * (n - 1) + [torch.Generator().manual_seed(7)])[0][-1]
              for n in (1, 2, 50) for _ in range(3)]  # fmt: skip
    assert len(set(seeded)) == 1


def test_draw_follows_the_probabilities_and_never_picks_a_zero() -> None:
    """Each row's picks come in proportion to its (unnormalised) probabilities, zeros never."""
    probs = torch.tensor([[0.0, 2.0, 0.0, 5.0, 3.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    n = 40_000
    picks = draw(probs.repeat(n, 1), torch.Generator().manual_seed(0)).view(n, 2)
    for row in range(2):
        freq = torch.bincount(picks[:, row], minlength=6).double() / n
        want = probs[row].double() / probs[row].sum()
        assert torch.all(freq[want == 0] == 0), freq
        # binomial standard error at p = 0.5 and n = 40k is 0.0025: 0.01 is four of them
        torch.testing.assert_close(freq, want, atol=0.01, rtol=0)


def test_draw_repeats_with_its_generator_and_reaches_the_last_token() -> None:
    probs = torch.softmax(torch.randn(8, 151_936, generator=torch.Generator().manual_seed(1)), -1)
    a = draw(probs, torch.Generator().manual_seed(3))
    assert torch.equal(a, draw(probs, torch.Generator().manual_seed(3)))
    assert not torch.equal(a, draw(probs, torch.Generator().manual_seed(4)))
    last = torch.zeros(1, 5)
    last[0, -1] = 1.0
    assert draw(last, None).tolist() == [4]
