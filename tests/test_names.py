from tvm_memplan.names import unique_name


def test_a_taken_stem_gets_the_first_free_suffix_and_is_recorded():
    used = {"conv", "conv_1"}
    assert unique_name("relu", used) == "relu"
    assert unique_name("conv", used) == "conv_2"
    assert unique_name("conv", used, first_suffix=2) == "conv_3"
    assert used == {"conv", "conv_1", "relu", "conv_2", "conv_3"}
