"""Small random transformers MoE models, built from a family's own config class with its sizes
shrunk, never downloaded: the tests, tools/transformers_ep_sweep.py and
tools/transformers_ep_bench.py build their models here.

tiny_config(model_type, ...) takes the family's default config and overrides whichever of the
sizes below it has (its other settings stay the family's own), then the same inside a nested
text_config. save_tiny(...) writes one with save_pretrained, seeded, for from_pretrained to load.
"""
import torch

#: The families `make test` covers (the sweep tool covers every one with an ep_dispatch_experts
#: rule).
CORE_FAMILIES = ("mixtral", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss")

_EXPERT_COUNT = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_TOP_K = ("num_experts_per_tok", "moe_topk", "num_experts_per_token")


def _sizes(hidden, layers, num_experts, top_k, vocab):
    heads = 4
    head = hidden // heads
    sizes = dict(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        intermediate_size=2 * hidden, moe_intermediate_size=hidden,
        shared_expert_intermediate_size=hidden,
        num_attention_heads=heads, num_key_value_heads=2, head_dim=head,
        max_position_embeddings=256, max_window_layers=layers, sliding_window=16,
        # MLA (DeepSeek, Kimi, GLM-MoE-DSA): small low-rank projections
        kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=head // 2, qk_nope_head_dim=head // 2,
        v_head_dim=head, qk_head_dim=head,
        # every layer an MoE layer, routed over one group
        first_k_dense_replace=0, decoder_sparse_step=1, n_group=1, topk_group=1,
        num_nextn_predict_layers=0, n_shared_experts=1,
        # sparse-attention indexers (DeepSeek-V3.2, GLM-MoE-DSA) and other routers' own names
        index_topk=4, index_head_dim=head, index_n_heads=2, num_expert_group=1,
        moe_k=top_k, moe_layer_start_index=0, moe_layer_end_index=layers - 1,
        moe_num_shared_experts=1, per_layer_config={},
        # state-space layers of the hybrids (Jamba, Granite, Nemotron-H): heads that divide
        # expand * hidden
        mamba_n_heads=4, mamba_d_head=hidden // 2, mamba_n_groups=1, mamba_chunk_size=16,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    sizes.update({name: num_experts for name in _EXPERT_COUNT})
    sizes.update({name: top_k for name in _TOP_K})
    return sizes


def _shrunk(config_class, sizes):
    defaults = config_class().to_dict()
    kwargs = {name: value for name, value in sizes.items() if name in defaults}
    if "kv_lora_rank" in defaults:  # MLA: head_dim is the rope part, a key/value head a query's
        kwargs["num_key_value_heads"] = sizes["num_attention_heads"]
        if "head_dim" in defaults:
            kwargs["head_dim"] = sizes["qk_rope_head_dim"]
    layers = defaults.get("num_hidden_layers")
    for name, value in defaults.items():  # per-layer lists (layer_types, mlp_layer_types, ...)
        if isinstance(value, list) and layers and len(value) == layers and name not in kwargs:
            kwargs[name] = value[:sizes["num_hidden_layers"]]
    if isinstance(defaults.get("mlp_only_layers"), list):  # layer indices: none dense here
        kwargs["mlp_only_layers"] = []
    if isinstance(defaults.get("text_config"), dict):
        text_class = type(config_class().get_text_config())
        kwargs["text_config"] = _shrunk(text_class, sizes).to_dict()
    return config_class(**kwargs)


def tiny_config(model_type, *, hidden=32, layers=2, num_experts=4, top_k=2, vocab=128):
    """The family's config with the sizes above (every other setting its default)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    return _shrunk(CONFIG_MAPPING[model_type], _sizes(hidden, layers, num_experts, top_k, vocab))


def save_tiny(path, model_type, *, seed=0, **sizes):
    """Writes a random model of tiny_config(model_type, **sizes) to `path` (save_pretrained)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **sizes), dtype=torch.float32)
    model.save_pretrained(path)
    return model.config
