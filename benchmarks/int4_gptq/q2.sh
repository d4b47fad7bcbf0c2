while pgrep -f "run.py HS_self" >/dev/null; do sleep 10; done
python hlib.py calib_docs_2k.txt HS_docs2k.npy
python hlib.py calib_docs_8k.txt HS_docs8k.npy
python run.py HS_docs2k.npy "gptq:wgrid=h;int8=k_proj|v_proj;g32=up_proj|down_proj;g64=q_proj|o_proj|gate_proj;name=gptq-wh M1 docs2k"
python run.py HS_docs8k.npy "gptq:wgrid=h;int8=k_proj|v_proj;g32=up_proj|down_proj;g64=q_proj|o_proj|gate_proj;name=gptq-wh M1 docs8k"
