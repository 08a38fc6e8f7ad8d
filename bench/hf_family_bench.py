"""Trainer on the seed's workload (512 random sequences of 512 tokens, one epoch) for a model
family other than BERT, with the configuration hone's built-in of the same name has.
Usage: python3 bench/hf_family_bench.py MODEL CONFIG [options]   (prints one JSON line)
  MODEL: roberta-large, xlm-roberta-large, distilbert-base-uncased, electra-large-discriminator,
    modernbert-large
  CONFIG: bf16_bs4 (bf16=True) or bf16_fused_bs4 (bf16, tf32, adamw_torch_fused); bf16 and
    bf16_fused are the same with the batch size of --batch_size (default 4).
Options (--seq and --n_samples default to the environment variable named, then to 512):
  --seq N (SEQ, 512)  --n_samples N (N_SAMPLES, 512)  --batch_size N (overrides CONFIG's)
  --max_steps N (Trainer's max_steps instead of one epoch)
  --num_hidden_layers N (a smaller model of the same shape, for a smoke test)
  --attn IMPL (the attention implementation; default: transformers' own choice, sdpa, except
    for ModernBERT, which gets the best one Trainer can use here: flash_attention_2 when the
    flash_attn package imports, else sdpa. The JSON line and stderr say which ran.)
Without CUDA it runs on the CPU (a smoke test: no NVML, memory fields null).
"""
import argparse, json, os, sys, time

LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
ROBERTA = dict(max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1)
# answerdotai/ModernBERT-large, its config.json on the Hub (December 2024): these fields differ
# from transformers' ModernBertConfig defaults (which are ModernBERT-base's):
#   hidden_size 1024, num_hidden_layers 28, num_attention_heads 16 (head_dim 64),
#   intermediate_size 2624 (Wi gives 2 x 2624: GeGLU input and gate), classifier_pooling "mean"
#   (the class default is "cls").
# These are in the released config.json and equal to the class defaults; they are written out
# so that the run does not depend on the defaults of the transformers installed:
#   vocab_size 50368, max_position_embeddings 8192, local_attention 128 (band |q - k| <= 64),
#   global_attn_every_n_layers 3 (layers 0, 3, 6, ... global), global_rope_theta 160000.0,
#   local_rope_theta 10000.0 (transformers 5 turns both into rope_parameters), pad_token_id
#   50283, bos_token_id = cls_token_id 50281, eos_token_id = sep_token_id 50282, norm_eps 1e-5,
#   norm_bias false, attention_bias/mlp_bias/classifier_bias false, hidden_activation and
#   classifier_activation "gelu", initializer_range 0.02, initializer_cutoff_factor 2.0, every
#   dropout 0.0.
MODERNBERT_LARGE = dict(
    hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, intermediate_size=2624,
    classifier_pooling="mean",
    vocab_size=50368, max_position_embeddings=8192, local_attention=128, global_attn_every_n_layers=3,
    global_rope_theta=160000.0, local_rope_theta=10000.0, pad_token_id=50283, bos_token_id=50281,
    cls_token_id=50281, eos_token_id=50282, sep_token_id=50282, norm_eps=1e-5, norm_bias=False,
    attention_bias=False, mlp_bias=False, classifier_bias=False, hidden_activation="gelu",
    classifier_activation="gelu", initializer_range=0.02, initializer_cutoff_factor=2.0,
    attention_dropout=0.0, embedding_dropout=0.0, mlp_dropout=0.0, classifier_dropout=0.0)
MODELS = {
    "roberta-large": ("RobertaConfig", dict(vocab_size=50265, **ROBERTA, **LARGE)),
    "xlm-roberta-large": ("XLMRobertaConfig", dict(vocab_size=250002, **ROBERTA, **LARGE)),
    "distilbert-base-uncased": ("DistilBertConfig", dict()),
    "electra-large-discriminator": ("ElectraConfig", dict(embedding_size=1024, **LARGE)),
    "modernbert-large": ("ModernBertConfig", MODERNBERT_LARGE),
}
BEST_ATTENTION = {"modernbert-large"}  # models run with the best attention available (--attn best)
CONFIGS = {
    "bf16_bs4": dict(per_device_train_batch_size=4, bf16=True),
    "bf16_fused_bs4": dict(per_device_train_batch_size=4, bf16=True, tf32=True, optim="adamw_torch_fused"),
    # The batch size from --batch_size (4 without it).
    "bf16": dict(per_device_train_batch_size=4, bf16=True),
    "bf16_fused": dict(per_device_train_batch_size=4, bf16=True, tf32=True, optim="adamw_torch_fused"),
}


def best_attention():
    """flash_attention_2 when the flash_attn package imports (ModernBERT's band then is FA2's
    window_size), else sdpa (the band as a boolean mask)."""
    try:
        import flash_attn  # noqa: F401
        return "flash_attention_2"
    except Exception as e:  # ImportError, or a build that does not match this torch
        print(f"hf_family_bench: flash_attn does not import ({type(e).__name__}: {e}); using sdpa",
              file=sys.stderr, flush=True)
        return "sdpa"


def parse(argv):
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("config", choices=list(CONFIGS))
    ap.add_argument("--seq", type=int, default=int(os.environ.get("SEQ", "512")))
    ap.add_argument("--n_samples", type=int, default=int(os.environ.get("N_SAMPLES", "512")))
    ap.add_argument("--batch_size", type=int, default=None)
    ap.add_argument("--max_steps", type=int, default=-1)
    ap.add_argument("--num_hidden_layers", type=int, default=None)
    ap.add_argument("--attn", default=None, help="eager, sdpa, flash_attention_2 or best")
    return ap.parse_args(argv)


def main(argv):
    a = parse(argv)
    t_start = time.time()
    import numpy as np, torch, transformers
    from transformers import AutoModelForSequenceClassification, TrainingArguments, Trainer, logging
    logging.set_verbosity_error()
    cuda = torch.cuda.is_available()
    if cuda:
        from pynvml import nvmlInit, nvmlDeviceGetHandleByIndex, nvmlDeviceGetMemoryInfo
        nvmlInit(); h = nvmlDeviceGetHandleByIndex(0)
        used = lambda: nvmlDeviceGetMemoryInfo(h).used // 2**20
    n, seq = a.n_samples, a.seq
    cls, kwargs = MODELS[a.model]
    if a.num_hidden_layers is not None:
        kwargs = dict(kwargs, num_hidden_layers=a.num_hidden_layers)
    attn = a.attn or ("best" if a.model in BEST_ATTENTION else None)
    if attn == "best":
        attn = best_attention()
    cfg = getattr(transformers, cls)(num_labels=2, **kwargs)
    torch.manual_seed(0)
    try:
        model = AutoModelForSequenceClassification.from_config(cfg, **({"attn_implementation": attn} if attn else {}))
    except (ImportError, ValueError) as e:  # flash_attn imports, but transformers will not use it
        if attn != "flash_attention_2" or a.attn == "flash_attention_2":
            raise
        print(f"hf_family_bench: transformers refuses flash_attention_2 ({e}); using sdpa", file=sys.stderr, flush=True)
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_config(cfg, attn_implementation="sdpa")
    model = model.to("cuda" if cuda else "cpu")
    ran = getattr(model.config, "_attn_implementation", None)
    print(f"hf_family_bench: {a.model}, {sum(p.numel() for p in model.parameters())} parameters, attention {ran}, "
          f"{n} x {seq} tokens", file=sys.stderr, flush=True)
    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.integers(100, 30000, (n, seq)))  # hone's synthetic ids: [100, 30000), label 0
    labels = torch.tensor(rng.integers(0, 1, (n,)))

    class DS(torch.utils.data.Dataset):
        def __len__(self): return n
        def __getitem__(self, i): return {"input_ids": ids[i], "labels": labels[i]}

    overrides = dict(CONFIGS[a.config])
    if a.batch_size is not None:
        overrides["per_device_train_batch_size"] = a.batch_size
    if not cuda:  # the smoke test
        overrides.pop("tf32", None)  # tf32 needs CUDA
        overrides["use_cpu"] = True
    args = dict(output_dir="/tmp/hf_family_out", num_train_epochs=1, max_steps=a.max_steps, log_level="error",
                report_to="none", save_strategy="no", logging_strategy="no", eval_strategy="no", **overrides)
    trainer = Trainer(model=model, args=TrainingArguments(**args), train_dataset=DS())
    out = trainer.train()
    res = {"model": a.model, "name": a.config, "n_samples": n, "seq": seq,
           "batch_size": overrides["per_device_train_batch_size"], "max_steps": a.max_steps,
           "num_hidden_layers": model.config.num_hidden_layers,
           "n_params": sum(p.numel() for p in model.parameters()), "attn_impl": ran,
           **{k: out.metrics[k] for k in ("train_runtime", "train_samples_per_second", "train_loss")},
           "nvml_after_train_mb": used() if cuda else None,
           "torch_max_reserved_mb": torch.cuda.max_memory_reserved() // 2**20 if cuda else None,
           "process_s_before_exit": time.time() - t_start,
           "gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
           "torch": torch.__version__, "transformers": transformers.__version__}
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
