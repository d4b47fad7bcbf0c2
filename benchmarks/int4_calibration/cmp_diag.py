import numpy as np, sys; sys.path.insert(0,'/tmp/exp'); from diaglib import load_diag
a=load_diag(sys.argv[1]); b=load_diag(*sys.argv[2].split(","))
for k in list(b)[:4]+[k for k in b if 'layers.10.' in k][:3]:
    x,y=a[k],b[k]; r=x/y
    print(k, 'sum ratio %.4f'%(x.sum()/y.sum()), 'elem ratio min/median/max %.3f %.3f %.3f'%(r.min(),np.median(r),r.max()), 'corr(log) %.4f'%np.corrcoef(np.log(x),np.log(y))[0,1])
rs=[a[k].sum()/b[k].sum() for k in b]; print('all: sum ratio min/median/max', min(rs), np.median(rs), max(rs))
cs=[np.corrcoef(np.log(a[k]),np.log(b[k]))[0,1] for k in b]; print('corr log min/median', min(cs), np.median(cs))
