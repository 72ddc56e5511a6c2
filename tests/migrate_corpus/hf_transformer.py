"""Hugging Face Trainer-loop style: a tiny transformer LM, AdamW, linear warmup, AMP with
torch.cuda.amp.autocast and GradScaler, device chosen by the usual one-liner.
# corpus: amp
"""
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"


class TinyLM(nn.Module):
    def __init__(self, vocab=64, d=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.block = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.head(self.block(self.embed(ids)))


def main():
    torch.manual_seed(42)
    print("device", torch.empty(0, device=device).device.type)
    model = TinyLM().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
    use_amp = torch.cuda.is_available()
    scaler = torch.cuda.amp.GradScaler(enabled=use_amp)
    batches = torch.randint(0, 64, (5, 4, 12))
    for step in range(5):
        ids = batches[step].to(device)
        with torch.cuda.amp.autocast(enabled=use_amp):
            logits = model(ids[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, 64), ids[:, 1:].reshape(-1))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        print("loss", loss.item())
    if torch.cuda.is_available():
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
