// Package deploy checks the deployment files of this directory against the
// real schemas and against the service itself:
//
//   - envoy.yaml parses into Envoy's v3 Bootstrap with Envoy's own protos and
//     passes their validation rules, typed_config contents included
//     (envoy_test.go);
//   - its rate_limits actions, emulated on a table of requests, produce
//     descriptors that the service, loaded with config/, matches and limits as
//     intended, and every rule in config/ is reached (envoy_test.go);
//   - its rate_limit_quota filter (RLQS) runs on the /quota route only, its
//     bucket settings hold against what Envoy's client does, and its
//     bucket_matchers, evaluated on a table of requests, build the bucket ids
//     intended (rlqs_test.go), which resolve to their rules of config/
//     (rlqs_bucket_test.go);
//   - docs/budgets.md's EnvoyPatchPolicy, applied as Envoy Gateway applies
//     it to route configurations Envoy Gateway renders (testdata/), makes
//     their token budget a reservation, which the emulation settles against
//     the service (envoygateway_test.go);
//   - the kustomizations under k8s/ decode strictly into the Kubernetes API
//     types and refer to each other consistently (k8s_test.go);
//   - the Helm chart under helm/, rendered by helm's packages for each of
//     its ci/ values files, passes helm's linter and the same checks, and
//     its defaults build what the kustomizations build (helm_test.go);
//   - the Dockerfile's build step yields a static binary that accepts
//     config/ (image_test.go).
//
// There is no Envoy, Docker or Kubernetes here: these are schema and
// consistency checks plus an emulation of Envoy's descriptor semantics.
package deploy

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// Paths, relative to this package's directory, where `go test` runs.
const (
	repoRoot      = ".."
	envoyFile     = "envoy.yaml"
	rulesDir      = "config"
	k8sDir        = "k8s"
	dockerfile    = "../Dockerfile"
	dockerignore  = "../.dockerignore"
	deployDocFile = "../docs/deploy.md"
)

// loadRules loads config/ as the service does with its default flags.
func loadRules(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Load(rulesDir, config.Defaults{})
	if err != nil {
		t.Fatalf("loading %s: %v", rulesDir, err)
	}
	return cfg
}

// ruleFiles returns the files the service reads from config/, relative to
// config/.
func ruleFiles(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, f := range loadRules(t).Files() {
		rel, err := filepath.Rel(rulesDir, f)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, rel)
	}
	return names
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
