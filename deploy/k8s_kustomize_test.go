package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// ---------------------------------------------------------------------------
// A small, strict reading of kustomize: the fields these kustomizations use
// (any other fails the strict decode), resources and generators resolved the
// way `kubectl apply -k` resolves them, including its load restrictions.

type kustomization struct {
	APIVersion         string            `json:"apiVersion"`
	Kind               string            `json:"kind"`
	Resources          []string          `json:"resources"`
	ConfigMapGenerator []configMapArgs   `json:"configMapGenerator"`
	GeneratorOptions   *generatorOptions `json:"generatorOptions"`
	Images             []imageOverride   `json:"images"`
}

type configMapArgs struct {
	Name    string            `json:"name"`
	Files   []string          `json:"files"`
	Options *generatorOptions `json:"options"`
}

type generatorOptions struct {
	Labels                map[string]string `json:"labels"`
	DisableNameSuffixHash bool              `json:"disableNameSuffixHash"`
}

type imageOverride struct {
	Name    string `json:"name"`
	NewName string `json:"newName"`
	NewTag  string `json:"newTag"`
}

// kustomizationFiles are the names kustomize recognizes, in its order.
var kustomizationFiles = []string{"kustomization.yaml", "kustomization.yml", "Kustomization"}

// object is one resource of a build.
type object struct {
	source string // file, or "generator NAME in DIR"
	kind   string // apiVersion/kind
	name   string
	labels map[string]string
	obj    any  // a pointer to the k8s.io/api type
	gen    *gen // for generated ConfigMaps
}

// gen records how a ConfigMap was generated.
type gen struct {
	hashed bool              // kustomize appends a content hash to the name
	files  map[string]string // data key -> the file it came from
}

// bundle is what a kustomization builds.
type bundle struct {
	dir     string
	objects []*object
	images  []imageOverride
}

// kinds maps apiVersion/kind to the API type a manifest must decode into.
var kinds = map[string]func() any{
	"apps/v1/Deployment":                     func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                    func() any { return &appsv1.StatefulSet{} },
	"v1/Service":                             func() any { return &corev1.Service{} },
	"v1/ConfigMap":                           func() any { return &corev1.ConfigMap{} },
	"policy/v1/PodDisruptionBudget":          func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler": func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"networking.k8s.io/v1/NetworkPolicy":     func() any { return &networkingv1.NetworkPolicy{} },
	// prometheus-operator's, rendered by the Helm chart on request.
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
}

// decodeManifest strictly decodes every document of a manifest file.
func decodeManifest(source string, data []byte) ([]*object, error) {
	var out []*object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		where := fmt.Sprintf("%s document %d", source, i+1)
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		kind := tm.APIVersion + "/" + tm.Kind
		newObj := kinds[kind]
		if newObj == nil {
			return nil, fmt.Errorf("%s: unknown apiVersion/kind %q", where, kind)
		}
		obj := newObj()
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("%s (%s): %w", where, kind, err)
		}
		meta := obj.(metav1.Object)
		if meta.GetName() == "" {
			return nil, fmt.Errorf("%s: no metadata.name", where)
		}
		if meta.GetNamespace() != "" {
			return nil, fmt.Errorf("%s: metadata.namespace %q: leave it to `kubectl apply -n` or the kustomization", where, meta.GetNamespace())
		}
		out = append(out, &object{source: where, kind: kind, name: meta.GetName(), labels: meta.GetLabels(), obj: obj})
	}
}

// realPath returns p as an absolute path with symlinks resolved.
func realPath(t *testing.T, p string) string {
	t.Helper()
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		t.Fatal(err)
	}
	return real
}

func within(root, p string) bool {
	return p == root || strings.HasPrefix(p, root+string(filepath.Separator))
}

// build reads the kustomization in dir as kustomize would, and applies its
// images overrides.
func build(t *testing.T, dir string) *bundle {
	t.Helper()
	b := &bundle{dir: dir}
	b.load(t, dir, nil)
	b.requireUnique(t)
	for _, img := range b.images {
		n := 0
		for _, w := range b.workloads() {
			for _, c := range w.containers() {
				if imageName(c.Image) == img.Name {
					c.Image = img.NewName + ":" + img.NewTag
					n++
				}
			}
		}
		if n == 0 || img.NewName == "" || img.NewTag == "" {
			t.Fatalf("%s: images entry %+v: applies to %d containers, needs newName and newTag", dir, img, n)
		}
	}
	return b
}

// requireUnique fails the test when two objects have one kind and name.
func (b *bundle) requireUnique(t *testing.T) {
	t.Helper()
	seen := map[string]string{}
	for _, o := range b.objects {
		id := o.kind + " " + o.name
		if prev, ok := seen[id]; ok {
			t.Fatalf("%s: %s defined twice (%s and %s)", b.dir, id, prev, o.source)
		}
		seen[id] = o.source
	}
}

func (b *bundle) load(t *testing.T, dir string, visited []string) {
	t.Helper()
	root := realPath(t, dir)
	for _, v := range visited {
		// kustomize refuses a resource directory at or above a root it
		// is already loading.
		if within(root, v) {
			t.Fatalf("%s: kustomization at or above %s, which includes it", dir, v)
		}
	}
	visited = append(visited, root)
	var found []string
	for _, name := range kustomizationFiles {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			found = append(found, name)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: kustomization files %v, want exactly one of %v", dir, found, kustomizationFiles)
	}
	kfile := filepath.Join(dir, found[0])
	var k kustomization
	if err := yaml.UnmarshalStrict(readFile(t, kfile), &k); err != nil {
		t.Fatalf("%s: %v", kfile, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Fatalf("%s: apiVersion %q kind %q", kfile, k.APIVersion, k.Kind)
	}
	// A file kustomize reads must be inside the kustomization's directory.
	inside := func(what, rel string) string {
		p := filepath.Join(dir, rel)
		if real := realPath(t, p); !within(root, real) {
			t.Fatalf("%s: %s %s is outside %s: kustomize refuses it (LoadRestrictionsRootOnly)", kfile, what, rel, dir)
		}
		return p
	}
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		info, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s: resource %s: %v", kfile, r, err)
		}
		if info.IsDir() {
			b.load(t, p, visited)
			continue
		}
		objs, err := decodeManifest(inside("resource", r), readFile(t, p))
		if err != nil {
			t.Fatal(err)
		}
		b.objects = append(b.objects, objs...)
	}
	for _, g := range k.ConfigMapGenerator {
		opts := generatorOptions{}
		for _, o := range []*generatorOptions{k.GeneratorOptions, g.Options} {
			if o != nil {
				opts.DisableNameSuffixHash = opts.DisableNameSuffixHash || o.DisableNameSuffixHash
				opts.Labels = mergeMaps(opts.Labels, o.Labels)
			}
		}
		cm := &corev1.ConfigMap{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
			ObjectMeta: metav1.ObjectMeta{Name: g.Name, Labels: opts.Labels},
			Data:       map[string]string{},
		}
		o := &object{source: fmt.Sprintf("generator %s in %s", g.Name, kfile), kind: "v1/ConfigMap", name: g.Name,
			labels: opts.Labels, obj: cm, gen: &gen{hashed: !opts.DisableNameSuffixHash, files: map[string]string{}}}
		for _, f := range g.Files {
			key, rel, ok := strings.Cut(f, "=")
			if !ok {
				key, rel = filepath.Base(f), f
			}
			if _, dup := cm.Data[key]; dup {
				t.Fatalf("%s: generator %s: key %s twice", kfile, g.Name, key)
			}
			p := inside("configMapGenerator file", rel)
			cm.Data[key] = string(readFile(t, p))
			o.gen.files[key] = p
		}
		b.objects = append(b.objects, o)
	}
	b.images = append(b.images, k.Images...)
}

func mergeMaps(a, b map[string]string) map[string]string {
	if len(a)+len(b) == 0 {
		return nil
	}
	m := maps.Clone(a)
	if m == nil {
		m = map[string]string{}
	}
	maps.Copy(m, b)
	return m
}

// imageName is an image reference without its tag or digest.
func imageName(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i]
	}
	return ref
}

// ---------------------------------------------------------------------------
// Accessors.

func objectsOf[T any](b *bundle) []T {
	var out []T
	for _, o := range b.objects {
		if v, ok := o.obj.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func (b *bundle) object(kind, name string) *object {
	for _, o := range b.objects {
		if o.kind == kind && o.name == name {
			return o
		}
	}
	return nil
}

func (b *bundle) configMap(name string) (*corev1.ConfigMap, *gen) {
	if o := b.object("v1/ConfigMap", name); o != nil {
		return o.obj.(*corev1.ConfigMap), o.gen
	}
	return nil, nil
}

// workload is a Deployment or StatefulSet.
type workload struct {
	kind     string
	name     string
	selector *metav1.LabelSelector
	template *corev1.PodTemplateSpec
}

func (b *bundle) workloads() []workload {
	var out []workload
	for _, o := range b.objects {
		switch w := o.obj.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{"Deployment", w.Name, w.Spec.Selector, &w.Spec.Template})
		case *appsv1.StatefulSet:
			out = append(out, workload{"StatefulSet", w.Name, w.Spec.Selector, &w.Spec.Template})
		}
	}
	return out
}

// containers returns pointers to every container of the pod, init
// containers (and native sidecars) first.
func (w workload) containers() []*corev1.Container {
	var out []*corev1.Container
	spec := &w.template.Spec
	for i := range spec.InitContainers {
		out = append(out, &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		out = append(out, &spec.Containers[i])
	}
	return out
}

func (w workload) container(name string) *corev1.Container {
	for _, c := range w.containers() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func (w workload) String() string { return w.kind + " " + w.name }

// selects reports whether the label selector matches labels (matchLabels
// only; matchExpressions are not used here and count as no match).
func selects(sel map[string]string, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func (b *bundle) selected(sel map[string]string) []workload {
	var out []workload
	for _, w := range b.workloads() {
		if selects(sel, w.template.Labels) {
			out = append(out, w)
		}
	}
	return out
}

// containerPort resolves a probe's or a Service's port in a container: a
// name, or a number, that the container declares.
func containerPort(c *corev1.Container, p intstr.IntOrString) (int32, bool) {
	for _, cp := range c.Ports {
		if p.Type == intstr.String && cp.Name == p.StrVal || p.Type == intstr.Int && cp.ContainerPort == p.IntVal {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

func podPort(w workload, p intstr.IntOrString) (int32, bool) {
	for _, c := range w.containers() {
		if n, ok := containerPort(c, p); ok {
			return n, true
		}
	}
	return 0, false
}

// flags reads a Go flag command line: --name=value, -name=value or
// --name value.
func flags(args []string) map[string]string {
	m := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			value, i = args[i+1], i+1
		}
		m[name] = value
	}
	return m
}

func addrPort(addr string) (int32, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(p, 10, 32)
	return int32(n), err
}

// preStopSleep is the longest preStop sleep of the pod.
func preStopSleep(w workload) time.Duration {
	var d time.Duration
	for _, c := range w.containers() {
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
			d = max(d, time.Duration(c.Lifecycle.PreStop.Sleep.Seconds)*time.Second)
		}
	}
	return d
}
