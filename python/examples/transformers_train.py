# torchrun --nproc-per-node 2 transformers_train.py MODEL_DIR   (any transformers MoE checkpoint)
import os, sys, torch
import pmoe.transformers                                # registers ep_implementation="pmoe"
from transformers import AutoModelForCausalLM, DistributedConfig

W = int(os.environ["WORLD_SIZE"])                       # experts over W ranks, FSDP the rest
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], distributed_config=DistributedConfig(
    fsdp_size=W, ep_size=W, ep_implementation="pmoe"))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(W))
for step in range(5):
    loss = model(ids, labels=ids).loss                  # dispatch/combine on pmoe, both ways
    loss.backward(); optimizer.step(); optimizer.zero_grad()
    print(f"rank {os.environ['RANK']} step {step} loss {loss.item():.4f}")
