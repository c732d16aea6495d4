#!/bin/bash
# Segment a folder of cases with a Slurm job array: every task takes its share of the sorted case
# list (`--shard auto` reads SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT, or _MIN/_MAX).
#
#   1. Set the four paths marked CHANGE ME (or export them before sbatch: sbatch --export=ALL).
#   2. sbatch examples/slurm_array.sh
#
# The array size (--array=0-3: 4 tasks) may be anything: the cases are dealt round robin among
# the tasks, each task writes its own outputs and its own report. Submitting again skips the cases
# whose labels exist (a task that died is simply redone). The input folder may hold NIfTI, NRRD,
# MetaImage or .hdr/.img files, sub-folders of one DICOM series each, or nnU-Net channel files
# (CASE_0000.nii.gz, CASE_0001.nii.gz → one case CASE).
#SBATCH --job-name=voxtile
#SBATCH --array=0-3
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=32G
#SBATCH --time=02:00:00
#SBATCH --output=voxtile-%A_%a.log
set -euo pipefail

VOXTILE=${VOXTILE:-voxtile}                  # CHANGE ME if voxtile is not on PATH
INPUT=${INPUT:-/path/to/cases}               # CHANGE ME: the folder of cases
MODEL=${MODEL:-/path/to/model.onnx}          # CHANGE ME: the ONNX model (its manifest beside it)
OUTPUT=${OUTPUT:-/path/to/labels}            # CHANGE ME: the output folder (created)

if [ ! -d "$INPUT" ] || [ ! -f "$MODEL" ]; then
    echo "slurm_array.sh: set INPUT (a folder) and MODEL (a file) first: $INPUT, $MODEL" >&2
    exit 1
fi
mkdir -p "$OUTPUT"
exec "$VOXTILE" segment "$INPUT" --model "$MODEL" -o "$OUTPUT" --shard auto \
    --report "$OUTPUT/report-${SLURM_ARRAY_TASK_ID:-0}.jsonl"
