#!/bin/sh
# Re-records the committed traces (see README.md here). Run from the repository root.
set -e
R="/usr/bin/python3 harness/record.py"
$R --model harness/models/gpt_varlen.py --out harness/records/gpt_varlen.spwt
$R --model harness/models/resnet50.py --out harness/records/resnet50.spwt --set batch=8 --set resolution=112 --set device=meta
$R --model harness/models/vit_b16.py --out harness/records/vit_b16.spwt --set batch=4 --set device=meta
$R --model harness/models/llama7b.py --out harness/records/llama7b.spwt --steps 2 --set steps=2
$R --model harness/models/resnet50.py --out harness/records/resnet50_8steps.spwt --steps 8 --set batch=8 --set resolution=112 --set device=meta
$R --model harness/models/vit_b16.py --out harness/records/vit_b16_8steps.spwt --steps 8 --set batch=4 --set device=meta
$R --model harness/models/llama7b.py --out harness/records/llama7b_8steps.spwt --steps 8 --set steps=8
$R --model harness/models/gpt_varlen.py --out harness/records/gpt_varlen_first_long.spwt --set long_step=0
