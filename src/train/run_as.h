#pragma once
// TrainingRun::run_as, the one place a step or an inference batch runs eagerly, is recorded
// into a CUDA graph, or is replayed: shared by trainer.cpp and inference.cpp.
#include "hone/trainer.h"

namespace hone {

template <typename F>
void TrainingRun::run_as(StepMode mode, StepGraphs* g, int StepGraphs::*recording, F&& body) {
  if (mode == StepMode::Eager) return body();
  int& id = g->*recording;
  if (mode == StepMode::Record) {
    be_.begin_recording();
    try {
      body();
      id = be_.end_recording();
    } catch (...) {
      be_.abort_recording();
      g->failed = true;  // the error ends this call; should the caller go on, the shape runs eagerly
      throw;
    }
  } else {
    ++replayed_;
  }
  be_.replay(id);  // recording runs nothing, so a recorded step runs now too
}

}  // namespace hone
