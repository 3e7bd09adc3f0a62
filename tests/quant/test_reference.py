"""onnxruntime as the reference: top-class agreement and the default run's margins where it is missed."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_memplan.quant.reference import top_class_agreement


def test_a_missed_top_class_reports_the_default_runs_margin_in_lsb():
    scale = 0.25
    default = [np.array([[0.0, 5.0, 3.0]]) * scale, np.array([[4.0, 1.0, 4.0]]) * scale]
    ours = [np.array([[0.0, 5.0, 6.0]]) * scale, np.array([[4.0, 1.0, 3.0]]) * scale]
    unoptimized = [np.array([[0.0, 4.0, 5.0]]) * scale, np.array([[4.0, 1.0, 4.0]]) * scale]
    agreement = top_class_agreement(ours, default, unoptimized, scale)
    assert (agreement.inputs, agreement.ours, agreement.unoptimized) == (2, 1, 1)
    assert agreement.ours_margins_lsb == [2] and agreement.unoptimized_margins_lsb == [2]
    assert agreement.ok and str(agreement) == "1/1 of 2"
    assert top_class_agreement(ours, default, unoptimized).ours_margins_lsb == []  # no scale: no margins


def test_runs_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="one output per input"):
        top_class_agreement([np.zeros(3)], [np.zeros(3)], [])
