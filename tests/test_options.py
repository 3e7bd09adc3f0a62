import pytest

from tvm_memplan.errors import UserError
from tvm_memplan.options import split_layout


@pytest.mark.parametrize("layout", ["auto", "nchw"])
def test_a_split_module_plans_in_nchw(layout):
    assert split_layout(layout) == "nchw"


def test_a_split_module_refuses_the_blocked_layout():
    with pytest.raises(UserError, match="--split acg does not support --layout blocked"):
        split_layout("blocked")
