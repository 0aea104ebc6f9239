"""train.plan.mfu's FLOPs a token: an embedding lookup is not a matrix product."""

from __future__ import annotations

import pytest

from train.plan import mfu
from train.recipe import presets
from train.recipe.params import preset_params

BASE = "transformer_wmt_en_de"


@pytest.mark.parametrize(("overrides", "tables"), [
    ([], 0),  # one shared matrix: it is the output projection
    (["share_all_embeddings=false", "share_decoder_input_output_embed=true"], 1),  # the encoder's table
    (["share_all_embeddings=false"], 2),  # the encoder's and the decoder's input tables
])
def test_unshared_embeddings_add_lookups_not_model_flops(overrides, tables):
    """Base with a 32k vocabulary: whatever the sharing, the matrix products are the same (layers and
    one V x d output projection), so the FLOPs a token are too; the extra tables only add parameters."""
    shared = presets.resolve(BASE).options
    options = presets.resolve(BASE, overrides).options
    assert preset_params(options, 32000) - preset_params(shared, 32000) == tables * 32000 * 512
    assert mfu.lookup_params(options, 32000) == tables * 32000 * 512
    assert mfu.flops_per_token(options, 32000, 27) == mfu.flops_per_token(shared, 32000, 27) == 366_120_960
