// The guides' "Accumulating values in a loop" (Better performance with tf.function): an
// RNN unrolled dynamically by kiln::for_range collects its states in a
// kiln::tensor_array, since appending to a C++ vector inside a graph loop would run only
// while tracing. The array's size may also be a tensor, known only when the graph runs.

#include <kiln/kiln.hpp>

#include <iostream>

int main() {
  using kiln::tensor;
  const std::int64_t batch_size = 2, seq_len = 3, feature_size = 4;

  // def rnn_step(inp, state): return inp + state
  auto rnn_step = [](const tensor& inp, const tensor& state) { return inp + state; };

  // The body of the guide's dynamic_rnn, for a sequence length that is a number (the
  // guide's input_data.shape[0], a static dim) or a tensor (tf.shape(input_data)[0]).
  auto unroll = [](auto step, const tensor& by_time, const tensor& initial_state, const auto& max_seq_len) {
    kiln::tensor_array states(kiln::float32, max_seq_len);
    auto [state, all] = kiln::for_range(
        max_seq_len,
        [&](const tensor& i, const tensor& state, const kiln::tensor_array& states) {
          tensor next = step(kiln::gather(by_time, i), state);
          return std::tuple{next, states.write(i, next)};
        },
        initial_state, states);
    return kiln::transpose(all.stack(), {1, 0, 2});
  };

  // @tf.function def dynamic_rnn(rnn_step, input_data, initial_state): ...
  kiln::function dynamic_rnn(
      [&](auto step, const tensor& input_data, const tensor& initial_state) {
        // [batch, time, features] -> [time, batch, features]
        const tensor by_time = kiln::transpose(input_data, {1, 0, 2});
        const std::int64_t max_seq_len = by_time.shape()[0];
        return unroll(step, by_time, initial_state, max_seq_len);
      },
      {.name = "dynamic_rnn"});

  // tf.random.uniform([batch_size, seq_len, feature_size]), here with a fixed seed.
  const tensor input_data = kiln::random::uniform({batch_size, seq_len, feature_size}, 0, 1, kiln::float32, 7);
  const tensor result = dynamic_rnn(rnn_step, input_data, kiln::zeros({batch_size, feature_size}));
  std::cout << result << "\n";

  // rnn_step adds, so each state is the running sum of the inputs over time.
  tensor running = kiln::zeros({batch_size, feature_size});
  bool matches = true;
  for (std::int64_t t = 0; t < seq_len; ++t) {
    running = running + kiln::gather(input_data, kiln::constant(t), 1);
    matches = matches && bool(kiln::reduce_max(kiln::abs(kiln::gather(result, kiln::constant(t), 1) - running)) < 1e-6f);
  }
  std::cout << "The states are the running sums of the inputs: " << (matches ? "true" : "false") << "\n";
  // One while node, however long the sequence: the graph does not grow with it.
  auto graph_size = [&](std::int64_t length) {
    const tensor inputs = kiln::random::uniform({batch_size, length, feature_size}, 0, 1, kiln::float32, 7);
    return dynamic_rnn.get_concrete_function(rnn_step, inputs, kiln::zeros({batch_size, feature_size})).graph().nodes().size();
  };
  std::cout << "dynamic_rnn's graph has " << graph_size(seq_len) << " nodes for sequences of " << seq_len << " steps and "
            << graph_size(100) << " for sequences of 100\n";

  // With the length a tensor, the array's size is known only when the graph runs:
  // one trace serves sequences of every length (here the time dim is None).
  kiln::function dynamic_rnn_any_length(
      [&](const tensor& input_data, const tensor& initial_state) {
        const tensor by_time = kiln::transpose(input_data, {1, 0, 2});
        return unroll(rnn_step, by_time, initial_state, kiln::shape_of(by_time)[0]);
      },
      {.name = "dynamic_rnn_any_length",
       .input_signature = std::vector<kiln::tensor_spec>{{{batch_size, kiln::none, feature_size}, kiln::float32},
                                                         {{batch_size, feature_size}, kiln::float32}}});
  auto same_values = [](const tensor& a, const tensor& b) {
    return a.shape() == b.shape() && a.to_vector<float>() == b.to_vector<float>();
  };
  const tensor zero_state = kiln::zeros({batch_size, feature_size});
  const tensor longer = kiln::random::uniform({batch_size, 100, feature_size}, 0, 1, kiln::float32, 7);
  const bool same = same_values(dynamic_rnn_any_length(input_data, zero_state), result) &&
                    same_values(dynamic_rnn_any_length(longer, zero_state), dynamic_rnn(rnn_step, longer, zero_state));
  std::cout << "With the length a tensor (tf.shape(input_data)[0]), dynamic_rnn traces "
            << dynamic_rnn_any_length.tracing_count() << " time for sequences of " << seq_len
            << " and 100 steps, with the same results: " << (same ? "true" : "false") << "\n";
}
