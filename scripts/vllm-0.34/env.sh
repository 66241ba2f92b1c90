# Added to /tmp/vllm-0.34/env.sh by device.sh.
# torch 2.14 was built against cuDNN 9.24 and refuses an older minor on its first cuDNN call; the image's
# 9.19 stands in (drop.txt) and nothing on this path calls cuDNN (no convolution, no cuDNN attention).
export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
