R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_new .whl/*.whl
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site_new .
cp -r /tmp/site_new /tmp/site
cp scratch/old/digests.py scratch/old/onepass_triton.py /tmp/site/detlab/tensors/ && cp scratch/old/recorder.py /tmp/site/detlab/sdk/
grep -c "class Scalars" /tmp/site/detlab/tensors/digests.py /tmp/site_new/detlab/tensors/digests.py
export PATH=/tmp/site_new/bin:$PATH PYTHONUNBUFFERED=1
