#!/usr/bin/env bash
# Session 9 run 3: the tile raster of the single-CTA and cluster configs on the shapes where ours trails
# cuBLASLt most as M grows (judged run 2: 8192 x 4096 x {4096, 14336} 0.971-0.980), group heights 4/8/16,
# then the cluster configs' L2 traffic by group (ncu), as prepared in benchmarks/prep/s9-second-run.sh.
tar xzf out/s9/fp8cache.tgz 2>/dev/null
source benchmarks/device_prelude.sh
timeout 260 python3 -P benchmarks/raster_bench.py --configs 7,10,11 --groups 4,8,16 \
  --shapes 8192x4096x4096,8192x4096x14336,8192x6144x4096,4096x4096x4096,8192x10240x8192 --json $OUT/raster.json 2>&1 | tee $OUT/raster.txt | tail -14
echo "=== ncu memory at $(el) s"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M="lts__t_sectors_op_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_sector_op_read_hit_rate.pct,dram__bytes_read.sum,gpu__time_duration.sum"
for c in 7 10 11; do for g in 8 16; do
  FP8_LINEAR_SM90_GROUP_M=$g timeout 40 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 \
    --launch-count 1 --metrics $M python3 -P benchmarks/profile_one.py --config $c --shape 8192 4096 4096 \
    > $OUT/ncu-mem-c$c-g$g.txt 2>&1
  echo "config $c group $g: $(grep -E 'lts__|l1tex__|dram__|gpu__time' $OUT/ncu-mem-c$c-g$g.txt | tr -s ' ' | cut -d' ' -f2,4 | tr '\n' ';')"
done; done
cat $OUT/ncu-mem-*.txt > $OUT/ncu-mem.txt; rm -f $OUT/ncu-mem-c*.txt
echo "=== end $(el) s"
