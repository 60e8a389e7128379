// The guides' "Looping over Python data" (Better performance with tf.function AutoGraph):
// a loop over C++ data unrolls while tracing, so the graph grows with the data; the same
// loop over a kiln::data::dataset is one ReduceDataset node, whatever the data. Then a
// small input pipeline (map, batch) read eagerly and inside a function. Last, the guides'
// iterators ("Using Python iterators and generators"): a C++ iterator is read while
// tracing only (buggy_consume_next), a kiln::data::iterator advances at every call
// (good_consume_next).

#include <kiln/kiln.hpp>

#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

using kiln::tensor;
using pairs = std::vector<std::pair<int, int>>;

// Python's str() of the guide's arguments: a list of pairs, or the dataset's repr.
std::string python_text(const pairs& data) {
  std::string s = "[";
  for (std::size_t i = 0; i < data.size(); ++i)
    s += (i ? ", (" : "(") + std::to_string(data[i].first) + ", " + std::to_string(data[i].second) + ")";
  return s + "]";
}
std::string python_text(const kiln::data::dataset& ds) {
  std::ostringstream os;
  os << ds;
  return os.str();
}

// def measure_graph_size(f, *args): prints how many nodes f's graph for args has.
template <class F, class Arg>
void measure_graph_size(F& f, const std::string& name, const Arg& arg) {
  std::cout << name << "(" << python_text(arg) << ") contains " << f.get_concrete_function(arg).graph().nodes().size()
            << " nodes in its graph\n";
}

// tf.abs(y - x) converts Python ints to a tensor; C++ asks for it.
tensor as_tensor(const tensor& t) { return t; }
tensor as_tensor(int v) { return kiln::constant(v); }

// tf.data.Dataset.from_generator(lambda: data, (tf.int32, tf.int32)): C++ code makes
// the elements at every call, as from_generator keeps the data in Python and fetches
// it through tf.py_function. Their shapes are unknown, so the loss's is too.
kiln::data::dataset generated(pairs data) {
  return kiln::data::dataset::from_generator([data = std::move(data)] { return data; }, {kiln::int32, kiln::int32});
}

}  // namespace

int main() {
  // kiln::print writes to standard error, as tf.print; the guides' notebooks show both
  // streams in order, and so does this program, on standard output.
  kiln::config::set_print_stream(std::cout);

  // @tf.function
  // def train(dataset):
  //   loss = tf.constant(0)
  //   for x, y in dataset:
  //     loss += tf.abs(y - x)  # Some dummy computation.
  //   return loss
  kiln::function train(
      [](const auto& dataset) {
        return kiln::for_each(
            dataset, [](const auto& x, const auto& y, const tensor& loss) { return loss + kiln::abs(as_tensor(y - x)); },
            kiln::constant(0));
      },
      {.name = "train"});

  const pairs small_data(3, {1, 1});
  const pairs big_data(10, {1, 1});
  measure_graph_size(train, "train", small_data);
  measure_graph_size(train, "train", big_data);

  const kiln::data::dataset small_dataset = generated(small_data), big_dataset = generated(big_data);
  measure_graph_size(train, "train", small_dataset);
  measure_graph_size(train, "train", big_dataset);

  // Datasets of one element spec share a trace, and each call reads its own dataset.
  std::cout << "train(small_data) = " << train(small_data) << "\n";
  std::cout << "train(big_dataset) = " << train(big_dataset) << "\n";
  std::cout << "train(other) = " << train(generated({{1, 3}, {2, 7}, {5, 4}})) << "\n";
  std::cout << "train traced " << train.tracing_count() << " times\n";

  // An input pipeline: map traced once, batch with a partial last batch.
  int map_traces = 0;
  const auto batches = kiln::data::dataset::range(5)
                           .map([&](const tensor& x) {
                             ++map_traces;
                             return kiln::cast(x, kiln::float32) * 0.5f;
                           })
                           .batch(2);
  std::cout << batches << "\n";
  for (const auto& batch : batches) std::cout << batch[0] << "\n";

  kiln::function batch_sums(
      [](const kiln::data::dataset& ds) {
        return kiln::for_each(ds, [](const tensor& batch, const tensor& total) { return total + kiln::reduce_sum(batch); },
                              kiln::constant(0.f));
      },
      {.name = "batch_sums"});
  std::cout << "batch_sums(batches) = " << batch_sums(batches) << "\n";
  std::cout << "batch_sums(batches) = " << batch_sums(batches) << "\n";
  std::cout << "the map function was traced " << map_traces << " time(s)\n";

  // @tf.function
  // def buggy_consume_next(iterator):
  //   tf.print("Value:", next(iterator))
  // iterator = iter([1, 2, 3])
  // An object the callable takes by reference is keyed by its address: the C++
  // iterator is read (and advanced) while tracing only, so every call prints 1.
  const std::vector<int> values{1, 2, 3};
  auto position = values.begin();
  kiln::function buggy_consume_next([](std::vector<int>::const_iterator& it) { kiln::print("Value:", kiln::constant(*it++)); });
  buggy_consume_next(position);
  buggy_consume_next(position);
  buggy_consume_next(position);

  // @tf.function
  // def good_consume_next(iterator):
  //   # This is ok, iterator is a tf.data.Iterator
  //   tf.print("Value:", next(iterator))
  // ds = tf.data.Dataset.from_tensor_slices([1, 2, 3])
  // iterator = iter(ds)
  kiln::function good_consume_next([](const kiln::data::iterator& it) { kiln::print("Value:", it.get_next()[0]); });
  auto ds = kiln::data::dataset::from_tensor_slices(kiln::constant({1, 2, 3}));
  auto iterator = ds.make_iterator();
  good_consume_next(iterator);
  good_consume_next(iterator);
  good_consume_next(iterator);
}
