// render-manifests prints the Kubernetes objects a Helm chart or a kustomize directory makes,
// as one YAML stream, with the real Helm (v4) template engine and the real kustomize: what
// `helm template` and `kubectl kustomize` would print, without a cluster and without either
// tool installed. tests/deploy/test_chart.py builds it and compares the two outputs object by
// object.
//
//	render-manifests helm CHART_DIR [--set key=value]...
//	render-manifests kustomize DIR
package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"helm.sh/helm/v4/pkg/strvals"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

const usage = "usage: render-manifests helm CHART_DIR [--set key=value]... | render-manifests kustomize DIR"

func main() {
	if len(os.Args) < 3 {
		fail(usage)
	}
	var out string
	var err error
	switch os.Args[1] {
	case "helm":
		out, err = renderChart(os.Args[2], os.Args[3:])
	case "kustomize":
		out, err = renderKustomize(os.Args[2])
	default:
		fail(usage)
	}
	if err != nil {
		fail(fmt.Sprintf("render-manifests %s %s: %v", os.Args[1], os.Args[2], err))
	}
	fmt.Print(out)
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, message)
	os.Exit(2)
}

// renderChart renders the chart as `helm template gpuslice DIR --namespace gpuslice` would,
// each --set applied over the chart's values; templates whose name starts with "_" are helpers.
func renderChart(dir string, args []string) (string, error) {
	chrt, err := loader.Load(dir)
	if err != nil {
		return "", err
	}
	given := map[string]any{}
	for i := 0; i < len(args); i++ {
		if args[i] != "--set" || i+1 >= len(args) {
			return "", fmt.Errorf("unexpected argument %q (accepted: --set key=value)", args[i])
		}
		i++
		if err := strvals.ParseInto(args[i], given); err != nil {
			return "", fmt.Errorf("--set %s: %v", args[i], err)
		}
	}
	options := common.ReleaseOptions{Name: "gpuslice", Namespace: "gpuslice", Revision: 1, IsInstall: true}
	values, err := util.ToRenderValues(chrt, given, options, common.DefaultCapabilities)
	if err != nil {
		return "", err
	}
	files, err := engine.Render(chrt, values)
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		base := name[strings.LastIndex(name, "/")+1:]
		if strings.HasPrefix(base, "_") || strings.HasSuffix(base, ".txt") {
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		if strings.TrimSpace(files[name]) == "" {
			continue
		}
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", name, strings.TrimRight(files[name], "\n"))
	}
	return b.String(), nil
}

func renderKustomize(dir string) (string, error) {
	objects, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return "", err
	}
	text, err := objects.AsYaml()
	if err != nil {
		return "", err
	}
	return string(text), nil
}
