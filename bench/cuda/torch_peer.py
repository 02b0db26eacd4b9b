"""torch_peer.py: the PyTorch + Hugging Face transformers peer for bench_cuda: a Qwen3-4B-shaped model with
random bf16 weights, a 512-token prompt, greedy decoding with a static KV cache and the one-token forward
compiled with CUDA graphs (torch.compile mode="reduce-overhead"). Prints tok/s and the bf16 roofline share."""
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.cache_utils import StaticCache

torch.manual_seed(0)
cfg = Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                  max_position_embeddings=4096, rope_theta=1e6)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = Qwen3ForCausalLM(cfg).eval()
wbytes = sum(p.numel() * p.element_size() for p in model.parameters())
NP, NEW = 512, 128
ids = torch.randint(0, cfg.vocab_size, (1, NP), device="cuda")
cache = StaticCache(config=cfg, max_batch_size=1, max_cache_len=NP + NEW + 16, device="cuda", dtype=torch.bfloat16)


def step(tok, pos):
    out = model(input_ids=tok, cache_position=pos, past_key_values=cache, use_cache=True)
    return out.logits[:, -1].argmax(-1, keepdim=True)


def cstep_run(f, tok, pos):
    torch.compiler.cudagraph_mark_step_begin()
    return f(tok, pos).clone()


with torch.no_grad():
    pos = torch.arange(NP, device="cuda")
    nxt = step(ids, pos)
    cstep = torch.compile(step, mode="reduce-overhead", fullgraph=False)
    # warm-up / compile
    p = NP
    for _ in range(3):
        nxt = cstep_run(cstep, nxt, torch.tensor([p], device="cuda"))
        p += 1
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 0
    while p < NP + NEW:
        nxt = cstep_run(cstep, nxt, torch.tensor([p], device="cuda"))
        p += 1
        n += 1
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    a = torch.empty(1 << 29, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ts = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); b.copy_(a); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    bw = 2 * a.numel() / (sorted(ts)[5] * 1e-3)
print(f"RESULT torch {torch.__version__} transformers static cache + reduce-overhead: {n / dt:.1f} tok/s "
      f"({1e3 * dt / n:.2f} ms/token); bf16 weights {wbytes / 1e9:.2f} GB; roofline {bw / wbytes:.0f} tok/s "
      f"at {bw / 1e9:.0f} GB/s; {100 * (n / dt) * wbytes / bw:.1f}% of roofline")
