"""pytorch/examples word_language_model style: an LSTM LM, truncated BPTT, gradient clipping."""
import torch
import torch.nn as nn


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, x, hidden):
        output, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(output).view(-1, self.decoder.out_features), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    return tuple(v.detach() for v in h)


def batchify(data, bsz, device):
    nbatch = data.size(0) // bsz
    return data[:nbatch * bsz].view(bsz, -1).t().contiguous().to(device)


def main():
    torch.manual_seed(1111)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(1111)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print("device", torch.empty(0, device=device).device.type)
    ntokens, bptt = 50, 8
    train_data = batchify(torch.randint(0, ntokens, (400,)), 5, device)
    model = RNNModel(ntokens, 16, 16, 2).to(device)
    criterion = nn.NLLLoss()
    lr = 5.0
    hidden = model.init_hidden(5)
    for i in range(0, train_data.size(0) - 1, bptt):
        seq_len = min(bptt, len(train_data) - 1 - i)
        data, targets = train_data[i:i + seq_len], train_data[i + 1:i + 1 + seq_len].reshape(-1)
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(torch.log_softmax(output, dim=-1), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        print("loss", loss.item())


if __name__ == "__main__":
    main()
