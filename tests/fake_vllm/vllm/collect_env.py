"""A few lines in the shape of vLLM's collect_env report (vllm/collect_env.py), one of them a secret."""

import os


def main():
    print("Collecting environment information...")
    print("==============================")
    print("        System Info")
    print("==============================")
    print("OS                           : Fake Linux")
    print("vLLM Version                 : 0.26.0-fake")
    print("==============================")
    print("     Environment Variables")
    print("==============================")
    print("VLLM_USE_V2_MODEL_RUNNER=0")
    print(f"HF_TOKEN={os.environ.get('FAKE_SECRET', 'hf_abcdefghijklmnopqrstuvwxyz123456')}")


if __name__ == "__main__":
    main()
