# vLLM 0.26.0's names and signatures (vllm/v1/attention/backends/flash_attn.py); `merged` records
# every suffix LSE the merge received, so tests can see the probe's injection.
merged = []


def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None):
    merged.append(suffix_lse)


def use_cascade_attention(common_prefix_len, query_lens, num_query_heads, num_kv_heads, use_alibi,
                          use_sliding_window, use_local_attention, num_sms, dcp_world_size):
    return common_prefix_len >= 256 and len(query_lens) >= 8


def cascade_attention(output, query, key_cache, value_cache, *, suffix_lse, common_prefix_len, fa_version):
    merge_attn_states(output, None, None, None, suffix_lse)


class FlashAttentionMetadataBuilder:
    def use_cascade_attention(self, *args, **kwargs):
        return use_cascade_attention(*args, **kwargs)


class FlashAttentionImpl:
    def __init__(self):
        self.vllm_flash_attn_version = 3

    def forward(self, lse, common_prefix_len):
        cascade_attention(None, None, None, None, suffix_lse=lse, common_prefix_len=common_prefix_len,
                          fa_version=self.vllm_flash_attn_version)
