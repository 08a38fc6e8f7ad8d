# Front door: `make demo` and `make test` install what is missing, configure and build.
BUILD ?= build
JOBS ?= $(shell nproc)
# The seed experiment on a GPU (kernels built for that GPU); a small BERT on a CPU-only machine.
ifeq ($(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu),gpu)
CMAKE_FLAGS ?= "-DCMAKE_CUDA_ARCHITECTURES=$(shell bash tools/cuda-arch.sh)"
DEMO_ARGS ?= --model_name_or_path bert-large-uncased --dataset synthetic:512x512 --per_device_train_batch_size 4 \
             --num_train_epochs 1 --save_strategy no --output_dir out/demo
else
DEMO_ARGS ?= --model_name_or_path bert-tiny --dataset synthetic:512x128 --per_device_train_batch_size 8 \
             --num_train_epochs 1 --logging_steps 16 --save_strategy no --output_dir out/demo
endif

.PHONY: deps build test demo clean

deps:
	@bash tools/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure

demo: build
	$(BUILD)/hone train $(DEMO_ARGS)

clean:
	rm -rf $(BUILD) out
