from vit_course.results import measurement  # (chapter 08 has it already: drop this line in the cell)

scaling = measurement("data_scaling")  # benchmarks/results/data_scaling.json: chapter 07's runs
seeds = scaling["seeds"]
print(f"{'images':>7}  {'most local head, layers 1-2':^{9 * len(seeds)}}  {'layer 1 mean':^{7 * len(seeds)}}"
      f"  {'test accuracy':^{8 * len(seeds)}}")
for size in scaling["sizes"]:
    runs = sorted((r for r in scaling["runs"] if r["model"] == "vit" and r["images"] == size), key=lambda r: r["seed"])
    first = [sum(r["distance_ratio"][0]) / len(r["distance_ratio"][0]) for r in runs]  # layer 1's mean per seed
    print(f"{size:>7,}  " + "".join(f"{r['min_ratio_layers_1_2']:>9.2f}" for r in runs)
          + "  " + "".join(f"{m:>7.2f}" for m in first) + "  " + "".join(f"{r['test_accuracy']:>8.1%}" for r in runs))
print("(one column per seed:", ", ".join(str(s) for s in seeds) + ")")
