// Model YAML (parse_model_yaml, as load_model reads scenarios/models/*.yaml or a model path). A
// model that parses must be self-consistent.
#include <string>

#include "fuzz_target.hpp"
#include "model/model_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace hisparse;
  fuzz::fuzz_one([&] {
    const ModelSpec m = parse_model_yaml(fuzz::as_text(data, size), "fuzz/model.yaml");
    fuzz::check(m.layers > 0 && m.hidden > 0 && m.vocab > 0, "a parsed model has an empty size");
    fuzz::check(m.kv_row_bytes() > 0, "a parsed model has no KV row");
    if (m.is_mla())
      fuzz::check(m.mla.kv_lora_rank > 0 && m.mla.qk_rope_head_dim % 2 == 0,
                  "a parsed MLA model has a bad latent or rope width");
    else
      fuzz::check(m.gqa.kv_heads > 0 && m.gqa.q_heads % m.gqa.kv_heads == 0,
                  "a parsed GQA model has q_heads not a multiple of kv_heads");
    if (m.has_indexer()) fuzz::check(m.is_mla(), "an indexer on a GQA model");
    (void)m.index_key_bytes();
  });
  return 0;
}
