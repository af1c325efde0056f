"""snip inside other training stacks.

* `snip.integrations.pretrained` -- continue pretraining a Hugging Face Llama/Mistral checkpoint
  with ``snip train --init-from-hf DIR`` (no `transformers` needed: the directory is read
  directly);
* `snip.integrations.hf` -- `SnipCallback`: SNIP's re-planning inside `transformers.Trainer`
  (needs ``pip install transformers accelerate``).
"""
