"""pytest set-up: the numpy reference forward pass (reference/model.py) importable by name, and
the tests that the sanitizer pass runs.

`make test` runs every test. `make test SAN=1` builds barellm and its tools with
AddressSanitizer and UndefinedBehaviorSanitizer, runs every C++ unit test on that build, and
then only the Python tests marked `sanitize` (`pytest -m sanitize`): those that feed the C++
code input it has not seen in the unit tests (hostile files and command lines, every command,
chat, the tokenizer on real vocabularies and generated text, each model family and weight
type once). The end-to-end comparisons they leave out (timing tables, perplexities, long texts,
the converter's own Python) run in the first pass only: the sanitizers would find nothing in
them that the marked tests do not reach. docs/TESTING.md lists what each pass runs.
"""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "reference"))

# The sanitizer pass: a file name with None (every test in it) or the names of its tests
# (without parameters) that the pass runs.
SANITIZE = {
    "test_cli.py": None,
    "test_cli_hostile.py": None,
    "test_chat.py": None,
    "test_chat_harmony.py": None,
    "test_chat_tools.py": None,
    "test_chat_command.py": None,
    "test_chat_hostile.py": None,
    "test_run_options.py": None,
    "test_end_to_end.py": None,
    "test_q4.py": None,
    "test_qwen.py": None,
    "test_convert_barellm_check.py": None,
    "test_outputs_never_replace_inputs.py": None,
    "test_q8.py": ["test_stories260k_q8_round_trip", "test_q8_logits_close_to_f32",
                   "test_odd_sizes", "test_refuses_scale_beyond_f16"],
    "test_bench.py": ["test_json_names_the_machine_and_the_simd_level"],
    "test_ladder.py": ["test_rungs_have_the_weights_threads_and_kernels_they_claim",
                       "test_every_rung_gives_the_greedy_text_of_run_on_the_same_weights",
                       "test_exact_rungs_stay_identical_over_a_long_text",
                       "test_in_memory_weights_equal_the_converters", "test_ladder_usage_errors",
                       "test_the_ladder_refuses_more_positions_than_the_model_has"],
    "test_tokenizer_parity.py": ["test_generated_texts_encode", "test_decode_and_stream_decode",
                                 "test_round_trip_of_generated_texts",
                                 "test_whole_word_merging_of_a_long_text",
                                 "test_unsupported_regex_is_refused_in_one_line",
                                 "test_regex_case_insensitive_letters"],
    "test_convert_gguf.py": ["test_quantized_types_close_to_f32",
                             "test_sentencepiece_tokenizer_of_stories260k"],
    "test_convert_kquants.py": ["test_a_mix_runs_as_its_dequantized_weights"],
    "test_convert_iquants.py": ["test_iquant_logits_are_the_references",
                                "test_iquants_on_the_cuda_backend",
                                "test_a_hostile_iq1_m_matrix_is_refused_in_one_line"],
    "test_convert_mxfp4.py": ["test_mxfp4_logits_are_the_references",
                              "test_mxfp4_experts_are_kept_and_run_as_the_reference",
                              "test_mxfp4_on_the_cuda_backend"],
    "test_convert_ternary.py": ["test_ternary_logits_are_the_references",
                                "test_ternary_types_on_the_cuda_backend",
                                "test_a_hostile_ternary_file_is_refused_in_one_line"],
    "test_serve.py": None,
    "test_serve_tools.py": None,
    # The CUDA backend on the emulation: its device memory is heap memory of the exact size
    # asked for, so a kernel or host step that reads or writes past a buffer fails here.
    "test_cuda_emulated.py": ["test_stories260k_decode_and_prefill",
                              "test_gemma_decode_and_prefill",
                              "test_block_types_decode_and_prefill",
                              "test_mixture_of_experts_decode_and_prefill",
                              "test_step_matches_cpu_forward", "test_warpgroup_gemm_prefill_on_sm90"],
    "test_moe.py": ["test_f32_logits_match_the_reference",
                    "test_quantized_matches_the_reference_on_the_dequantized_weights",
                    "test_the_loader_refuses_bad_expert_fields",
                    "test_the_ladder_refuses_a_mixture_of_experts"],
}


def pytest_configure(config):
    config.addinivalue_line("markers", "sanitize: also run in the sanitizer pass "
                            "(make test SAN=1); see tests/conftest.py")


def pytest_collection_modifyitems(config, items):
    modules = {}
    for item in items:
        file_name = os.path.basename(item.fspath)
        modules.setdefault(file_name, item.module)
        names = SANITIZE.get(file_name, ())
        if names is None or item.originalname in names:
            item.add_marker(pytest.mark.sanitize)
    # A renamed test must not drop out of the pass unnoticed (checked against each collected
    # file's functions, so that running a few of its tests by name or -k still works).
    for file_name, module in modules.items():
        missing = [name for name in SANITIZE.get(file_name) or () if not hasattr(module, name)]
        if missing:
            raise pytest.UsageError(f"tests/conftest.py SANITIZE names tests of {file_name} "
                                    f"that do not exist: {', '.join(sorted(missing))}")
