import time, torch, statistics, os, json, sys
torch.set_num_threads(1)
from snip.nn.gemm import quantize_operand
from snip.formats import Rounding, get_spec
cases=[]
for p in os.environ.get("ISA_PRESETS","mxfp4,nvfp4,fp8_e4m3,fp4_e2m1_tile128,mxfp8_e4m3").split(","):
    for cols in (64,192):
        for ax in (-1,0):
            for r in (Rounding.RNE, Rounding.STOCHASTIC):
                cases.append((p,cols,ax,r))
xs={c:torch.randn(1024,c) for c in (64,192,704)}
for p,c,ax,r in cases: quantize_operand(xs[c], get_spec(p), ax, r, 7)
res={i:[] for i in range(len(cases))}
for rnd in range(7):
    for i,(p,c,ax,r) in enumerate(cases):
        s=get_spec(p); x=xs[c]
        t=time.process_time()
        for _ in range(20): quantize_operand(x, s, ax, r, 7)
        res[i].append((time.process_time()-t)/20*1e6)
out={f"{p} {c} {ax} {r.value}": statistics.median(res[i]) for i,(p,c,ax,r) in enumerate(cases)}
json.dump(out, open(sys.argv[1],"w"))
