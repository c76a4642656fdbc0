#!/bin/bash
# Sequential queue (session of 2026-11-25 20:10Z): the runs queue.sh had not reached. One training process at a time.
cd /work/parity
A="-num_clients 100 -com_round 170 -sample_ratio 0.1 -batch_size 64 -epochs 3 -lr 0.01 -glr 1 -dataset fmnist -dseed 2023"
P="-partition dirichlet -dir 0.1"
L="--dataset fmnist --local_model MLP --dirichlet_alpha 0.1 --node_num 20 --T 200 --E 3 --random_seed 8 --lr 0.08 --local_wd_rate 5e-4 --momentum 0.9"
R=PARITY_REMAP_ROOT=/home/Dataset/FashionMNIST=/work/parity/FedLAW/data
for S in 37 73; do
./run_one.sh fedaware_fedaware_seed$S /work/parity/FedAWARE -- python fedaware.py $A -seed $S $P -alpha 0.3
./run_one.sh fedaware_fedavg_seed$S /work/parity/FedAWARE -- python baselines/fedavg.py $A -seed $S $P
done
./run_one.sh fedlaw_fedlaw_seed8 /work/parity/FedLAW $R PARITY_PATCH_FEDLAB=0 -- python main_fedlaw.py $L
echo QUEUE_DONE $(date -u)
