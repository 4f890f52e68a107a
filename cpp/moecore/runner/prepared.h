// A runner path prepared once for fixed shapes: the CPU analogue of capturing it in a CUDA graph.
// Each backend registers a prepare function per dispatch format it runs; MoeRunner::prepare picks
// it at capture time, so replaying does no registry lookups.
#pragma once

#include <functional>
#include <memory>

#include "moecore/runner/io.h"

namespace moecore {

/// The prepare function validated the dispatch output and quant info against the config,
/// resolved every kernel, and allocated every buffer the path writes (workspace and schedule
/// sized for the dispatch output's token capacity). run() reads the current contents of the
/// dispatch output's tensors and rewrites combine_input()'s tensors — the same bits as the
/// eager path — with no heap allocation and no lookups. The dispatch output, the quant info and
/// their tensors must stay alive with unchanged shapes; the prepared run keeps them referenced.
/// One run() at a time (callers serialize).
class PreparedRun {
 public:
  virtual ~PreparedRun() = default;
  virtual void run() = 0;
  /// Allocated at prepare time; run() rewrites its tensors in place.
  const CombineInputPtr& combine_input() const { return combine_input_; }

 protected:
  explicit PreparedRun(CombineInputPtr combine_input) : combine_input_(std::move(combine_input)) {}
  CombineInputPtr combine_input_;
};
using PreparedRunPtr = std::unique_ptr<PreparedRun>;

/// Gets the runner's a2a backend too: one dispatch format can follow different rules under
/// different backends (a StandardDispatchOutput under a2a flashinfer carries its invalid-token id
/// and pre-quantized payload as FlashInfer's all-to-all leaves them).
using PrepareFn = std::function<PreparedRunPtr(const DispatchOutputPtr&, const QuantInfoPtr&,
                                               const MoeRunnerConfig&, MoeA2ABackend)>;

}  // namespace moecore
