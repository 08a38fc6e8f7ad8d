"""Trainer on the seed's workload (512 random sequences of 512 tokens, one epoch) for a model
family other than BERT, with the configuration hone's built-in of the same name has.
Usage: python3 bench/hf_family_bench.py MODEL CONFIG   (prints one JSON line)
  MODEL: roberta-large, xlm-roberta-large, distilbert-base-uncased, electra-large-discriminator
  CONFIG: bf16_bs4 (bf16=True) or bf16_fused_bs4 (bf16, tf32, adamw_torch_fused)
Environment: N_SAMPLES (512), SEQ (512).
"""
import json, os, sys, time

LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
ROBERTA = dict(max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1)
MODELS = {
    "roberta-large": ("RobertaConfig", dict(vocab_size=50265, **ROBERTA, **LARGE)),
    "xlm-roberta-large": ("XLMRobertaConfig", dict(vocab_size=250002, **ROBERTA, **LARGE)),
    "distilbert-base-uncased": ("DistilBertConfig", dict()),
    "electra-large-discriminator": ("ElectraConfig", dict(embedding_size=1024, **LARGE)),
}
CONFIGS = {
    "bf16_bs4": dict(per_device_train_batch_size=4, bf16=True),
    "bf16_fused_bs4": dict(per_device_train_batch_size=4, bf16=True, tf32=True, optim="adamw_torch_fused"),
}


def main(model_name, config_name):
    t_start = time.time()
    import numpy as np, torch, transformers
    from pynvml import nvmlInit, nvmlDeviceGetHandleByIndex, nvmlDeviceGetMemoryInfo
    from transformers import AutoModelForSequenceClassification, TrainingArguments, Trainer, logging
    logging.set_verbosity_error()
    nvmlInit(); h = nvmlDeviceGetHandleByIndex(0)
    used = lambda: nvmlDeviceGetMemoryInfo(h).used // 2**20
    n, seq = int(os.environ.get("N_SAMPLES", "512")), int(os.environ.get("SEQ", "512"))
    cls, kwargs = MODELS[model_name]
    cfg = getattr(transformers, cls)(num_labels=2, **kwargs)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(cfg).to("cuda")
    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.integers(100, 30000, (n, seq)))
    labels = torch.tensor(rng.integers(0, 1, (n,)))

    class DS(torch.utils.data.Dataset):
        def __len__(self): return n
        def __getitem__(self, i): return {"input_ids": ids[i], "labels": labels[i]}

    args = dict(output_dir="/tmp/hf_family_out", num_train_epochs=1, log_level="error", report_to="none",
                save_strategy="no", logging_strategy="no", eval_strategy="no", **CONFIGS[config_name])
    trainer = Trainer(model=model, args=TrainingArguments(**args), train_dataset=DS())
    out = trainer.train()
    res = {"model": model_name, "name": config_name, "n_samples": n, "seq": seq,
           "n_params": sum(p.numel() for p in model.parameters()),
           "attn_impl": getattr(model.config, "_attn_implementation", None),
           **{k: out.metrics[k] for k in ("train_runtime", "train_samples_per_second", "train_loss")},
           "nvml_after_train_mb": used(), "torch_max_reserved_mb": torch.cuda.max_memory_reserved() // 2**20,
           "process_s_before_exit": time.time() - t_start, "gpu": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "transformers": transformers.__version__}
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
