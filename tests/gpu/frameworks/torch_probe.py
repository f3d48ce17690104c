# A first PyTorch probe: device query, matmul (cuBLAS), convolution forward/backward (cuDNN).
import torch
print("available", torch.cuda.is_available(), "count", torch.cuda.device_count())
d = torch.device("cuda")
torch.manual_seed(0)
x = torch.arange(16.0, device=d).reshape(4, 4)
print("elementwise", float((x * 2 + 1).sum()))
a = torch.randn(256, 256, device=d)
b = torch.randn(256, 256, device=d)
print("matmul", round(float((a @ b).sum()), 2))
conv = torch.nn.Conv2d(3, 8, 3).to(d)
y = conv(torch.randn(8, 3, 32, 32, device=d))
y.sum().backward()
print("conv backward", round(float(conv.weight.grad.abs().sum()), 2))
