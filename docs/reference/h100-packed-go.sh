#!/bin/bash
# Device batch for issue 49: the verify-kernel table, the packed attention probe, packed step tables.
# usage: bash go.sh PART   (PART 1 or 2); writes $OUT/res.tgz and $OUT/log.txt
export PYTHONUNBUFFERED=1
PART=${1:-1}
R=/tmp/res; mkdir -p $R
pack() { tar czf /tmp/p$BASHPID.tgz -C $R . && mv /tmp/p$BASHPID.tgz $OUT/res$PART.tgz; }
T0=$(date +%s)
( while sleep 15; do pack; done ) & PK=$!
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
if [ "$PART" = 1 ]; then
  python3 probe_verify_kernels.py --out $R/k; pack
  python3 probe_attention.py --verify packed --out $R/p --heads 32/32/128,32/8/128,40/8/128,12/2/128,32/8/64,16/16/128,64/8/128; pack
  python3 measure_steptimes.py --variant packed --no-gpm --seconds-per-point 0.15 --max-reps 20 \
    --shapes llama3-8b,qwen2.5-14b --contexts 1024,8192,16384 --out $R/t --deadline-s $(left 420); pack
else
  python3 measure_steptimes.py --variant packed --no-gpm --seconds-per-point 0.15 --max-reps 20 \
    --shapes qwen2.5-1.5b,llama3.2-1b --contexts 1024,8192 --out $R/t --deadline-s $(left 90); pack
  python3 measure_steptimes.py --variant packed --no-gpm --seconds-per-point 0.15 --max-reps 20 \
    --shapes llama2-7b --contexts 1024 --out $R/t --deadline-s $(left 120); pack
  python3 measure_steptimes.py --variant packed --no-gpm --seconds-per-point 0.15 --max-reps 20 \
    --shapes qwen2.5-1.5b --contexts 16384,4096,2048 --out $R/t --deadline-s $(left 200); pack
  python3 measure_steptimes.py --variant packed --no-gpm --seconds-per-point 0.15 --max-reps 20 \
    --shapes llama3-8b,qwen2.5-14b --contexts 4096,2048 --out $R/t --deadline-s $(left 250); pack
fi
kill $PK; pack; echo "done part $PART after $(( $(date +%s) - T0 )) s"
