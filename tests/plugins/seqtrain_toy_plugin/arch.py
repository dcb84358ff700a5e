"""toy_micro: a BART preset smaller than bart_tiny (32 dims, 1 + 1 layers, 2 heads, FFN 48)."""

from seqtrain.models.bart import bart_tiny
from seqtrain.registry import ARCHS


@ARCHS.register("toy_micro")
def toy_micro(args):
    sizes = dict(encoder_embed_dim=32, encoder_ffn_embed_dim=48, encoder_layers=1, encoder_attention_heads=2)
    sizes.update(decoder_embed_dim=32, decoder_ffn_embed_dim=48, decoder_layers=1, decoder_attention_heads=2)
    for name, value in sizes.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    bart_tiny(args)  # fills the rest (dropout, embeddings, positions) as bart_tiny does
