import math

import pytest
import torch

from rlcore.core.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    build_kl_controller,
    kl_estimate,
    kl_penalized_rewards,
)
from rlcore.core.config.schema import KLControllerConfig

LP = torch.tensor([-1.0, -2.0, -0.5])
REF = torch.tensor([-1.5, -1.0, -0.5])
# lp - ref = [0.5, -1.0, 0.0]


def test_k1_and_abs():
    torch.testing.assert_close(kl_estimate(LP, REF, "k1"), torch.tensor([0.5, -1.0, 0.0]))
    torch.testing.assert_close(kl_estimate(LP, REF, "abs"), torch.tensor([0.5, 1.0, 0.0]))


@pytest.mark.parametrize("kind", ["k2", "mse"])
def test_k2(kind):
    # 0.5 * [0.25, 1, 0]
    torch.testing.assert_close(kl_estimate(LP, REF, kind), torch.tensor([0.125, 0.5, 0.0]))


@pytest.mark.parametrize("kind", ["k3", "low_var_kl"])
def test_k3(kind):
    # x = ref - lp = [-0.5, 1, 0]; exp(x) - x - 1:
    #   exp(-0.5) + 0.5 - 1 = 0.60653066 - 0.5 = 0.10653066
    #   exp(1) - 1 - 1 = 0.71828183
    #   1 - 0 - 1 = 0
    torch.testing.assert_close(kl_estimate(LP, REF, kind), torch.tensor([0.10653066, 0.71828183, 0.0]))


def test_k3_clamped_with_finite_grad():
    # x = ref - lp = 20: exp(20) - 21 >> 10; x = -30: exp(-30) + 29 > 10; x = 100 would overflow exp
    lp = torch.tensor([-20.0, 0.0, -100.0], requires_grad=True)
    ref = torch.tensor([0.0, -30.0, 0.0])
    kl = kl_estimate(lp, ref, "k3")
    torch.testing.assert_close(kl, torch.tensor([10.0, 10.0, 10.0]))
    kl.sum().backward()
    assert lp.grad.tolist() == [0.0, 0.0, 0.0]


def test_unknown_estimator_lists_valid():
    with pytest.raises(ValueError, match="k1, abs, k2, mse, k3, low_var_kl; got 'k4'"):
        kl_estimate(LP, REF, "k4")


def test_kl_penalized_rewards():
    lp = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.3, -9.0]])
    ref = torch.tensor([[-1.5, -1.0, -7.0], [-0.5, -0.3, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    # k1 per token: [[0.5, -1.0, (6.5 masked)], [0.3, 0.0, (-9 masked)]] -> per sequence [-0.5, 0.3]
    # scores - 0.1 * kl = [1.0 + 0.05, 0.5 - 0.03]
    scores, kl = kl_penalized_rewards(torch.tensor([1.0, 0.5]), lp, ref, mask, "k1", 0.1)
    torch.testing.assert_close(kl, torch.tensor([-0.5, 0.3]))
    torch.testing.assert_close(scores, torch.tensor([1.05, 0.47]))


def test_fixed_controller():
    ctrl = FixedKLController(0.05)
    ctrl.update(current_kl=10.0, n_steps=1000)
    assert ctrl.value == 0.05


@pytest.mark.parametrize(
    ("current_kl", "expected"),
    [
        (1.1, 0.1 * (1 + 0.1 * 10 / 100)),  # err 0.1 -> 0.101 (up)
        (0.95, 0.1 * (1 - 0.05 * 10 / 100)),  # err -0.05 -> 0.0995 (down)
        (5.0, 0.1 * (1 + 0.2 * 10 / 100)),  # err 4 clipped to 0.2 -> 0.102
        (0.0, 0.1 * (1 - 0.2 * 10 / 100)),  # err -1 clipped to -0.2 -> 0.098
    ],
)
def test_adaptive_controller(current_kl, expected):
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=100)
    ctrl.update(current_kl=current_kl, n_steps=10)
    assert math.isclose(ctrl.value, expected, rel_tol=1e-12)


def test_controller_state_roundtrip():
    ctrl = AdaptiveKLController(0.1, 1.0, 100)
    ctrl.update(2.0, 10)  # 0.102
    restored = AdaptiveKLController(0.1, 1.0, 100)
    restored.load_state_dict(ctrl.state_dict())
    assert restored.value == ctrl.value == pytest.approx(0.102)
    fixed = FixedKLController(0.3)
    fixed.load_state_dict({"value": 0.7})
    assert fixed.state_dict() == {"value": 0.7}


def test_build_kl_controller():
    fixed = build_kl_controller(KLControllerConfig(type="fixed", kl_coef=0.02))
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.02
    adaptive = build_kl_controller(
        KLControllerConfig(type="adaptive", kl_coef=0.05, target_kl=0.2, horizon=500)
    )
    assert isinstance(adaptive, AdaptiveKLController)
    adaptive.update(current_kl=0.22, n_steps=50)  # err 0.1 -> 0.05 * (1 + 0.1 * 50 / 500) = 0.0505
    assert adaptive.value == pytest.approx(0.0505)
    with pytest.raises(ValueError, match="fixed, adaptive; got 'pid'"):
        build_kl_controller(KLControllerConfig(type="pid"))
