package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/slidingwindow/ratelimit/internal/config"
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
	seen := map[string]string{}
	for _, o := range b.objects {
		id := o.kind + " " + o.name
		if prev, ok := seen[id]; ok {
			t.Fatalf("%s: %s defined twice (%s and %s)", dir, id, prev, o.source)
		}
		seen[id] = o.source
	}
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

// ---------------------------------------------------------------------------
// Checks, as a list of problems so that the tests can also prove that a
// broken manifest is caught.

// recommended labels every object and pod carries.
var recommendedLabels = []string{"app.kubernetes.io/name", "app.kubernetes.io/component", "app.kubernetes.io/part-of"}

// ratelimitImage is the image name the manifests use for this service, which
// the kustomizations' images entries point at the real one.
const ratelimitImage = "ratelimit"

func (b *bundle) problems(t *testing.T) []string {
	t.Helper()
	var ps []string
	add := func(format string, args ...any) { ps = append(ps, fmt.Sprintf(format, args...)) }

	for _, o := range b.objects {
		for _, l := range recommendedLabels {
			if o.labels[l] == "" {
				add("%s %s (%s): no label %s", o.kind, o.name, o.source, l)
			}
		}
	}

	for _, w := range b.workloads() {
		spec := &w.template.Spec
		sel := w.selector
		if sel == nil || len(sel.MatchExpressions) > 0 || !selects(sel.MatchLabels, w.template.Labels) {
			add("%s: selector %v does not match its pod template's labels", w, sel)
		}
		for _, l := range recommendedLabels {
			if w.template.Labels[l] == "" {
				add("%s: pod template has no label %s", w, l)
			}
		}
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			add("%s: automountServiceAccountToken is not false", w)
		}
		if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
			add("%s: enableServiceLinks is not false", w)
		}
		if spec.TerminationGracePeriodSeconds == nil {
			add("%s: no terminationGracePeriodSeconds", w)
		}
		psc := spec.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
			add("%s: pod securityContext.runAsNonRoot is not true", w)
		}
		if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			add("%s: pod securityContext.seccompProfile is not RuntimeDefault", w)
		}

		volumes := map[string]*corev1.Volume{}
		for i := range spec.Volumes {
			v := &spec.Volumes[i]
			volumes[v.Name] = v
			if cmv := v.ConfigMap; cmv != nil {
				cm, _ := b.configMap(cmv.Name)
				if cm == nil {
					add("%s: volume %s: ConfigMap %q is not in the build", w, v.Name, cmv.Name)
					continue
				}
				for _, it := range cmv.Items {
					if _, ok := cm.Data[it.Key]; !ok {
						add("%s: volume %s: ConfigMap %s has no key %s", w, v.Name, cmv.Name, it.Key)
					}
				}
			}
		}
		mounted := map[string]bool{}
		portNames := map[string]string{}
		portNumbers := map[int32]string{}
		for _, c := range w.containers() {
			where := fmt.Sprintf("%s container %s", w, c.Name)
			for _, m := range c.VolumeMounts {
				mounted[m.Name] = true
				if volumes[m.Name] == nil {
					add("%s: volumeMount %s: no such volume", where, m.Name)
				}
			}
			if name, tag := imageName(c.Image), strings.TrimPrefix(c.Image, imageName(c.Image)); tag == "" || tag == ":latest" || name == ratelimitImage {
				add("%s: image %q is not pinned to a tag", where, c.Image)
			}
			sc := c.SecurityContext
			switch {
			case sc == nil:
				add("%s: no securityContext", where)
			default:
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					add("%s: allowPrivilegeEscalation is not false", where)
				}
				if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					add("%s: readOnlyRootFilesystem is not true", where)
				}
				if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
					add("%s: capabilities are not drop [ALL]", where)
				}
				if sc.Privileged != nil && *sc.Privileged {
					add("%s: privileged", where)
				}
				if sc.RunAsUser != nil && *sc.RunAsUser == 0 || sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot {
					add("%s: runs as root", where)
				}
			}
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				req, okReq := c.Resources.Requests[r]
				lim, okLim := c.Resources.Limits[r]
				if !okReq || !okLim || req.IsZero() {
					add("%s: resources need requests and limits of %s", where, r)
				} else if lim.Cmp(req) < 0 {
					add("%s: %s limit %s below request %s", where, r, lim.String(), req.String())
				}
			}
			if imageName(c.Image) == "redis" {
				for _, p := range redisProblems(c) {
					add("%s: %s", where, p)
				}
			}
			for _, p := range c.Ports {
				if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
					add("%s: port name %q: %s", where, p.Name, strings.Join(errs, "; "))
				}
				if prev, dup := portNames[p.Name]; dup {
					add("%s: port name %s also in container %s", where, p.Name, prev)
				}
				if prev, dup := portNumbers[p.ContainerPort]; dup {
					add("%s: port %d also in container %s", where, p.ContainerPort, prev)
				}
				portNames[p.Name], portNumbers[p.ContainerPort] = c.Name, c.Name
			}
			probes := map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe}
			for _, kind := range slices.Sorted(maps.Keys(probes)) {
				p := probes[kind]
				if p == nil {
					if kind != "startupProbe" && len(c.Ports) > 0 {
						add("%s: serves ports but has no %s", where, kind)
					}
					continue
				}
				var port intstr.IntOrString
				switch {
				case p.GRPC != nil:
					port = intstr.FromInt32(p.GRPC.Port)
				case p.HTTPGet != nil:
					port = p.HTTPGet.Port
				case p.TCPSocket != nil:
					port = p.TCPSocket.Port
				case p.Exec != nil:
					continue
				}
				if _, ok := containerPort(c, port); !ok {
					add("%s: %s port %s is not a port of the container", where, kind, port.String())
				}
			}
			if c.Name == ratelimitImage {
				ps = append(ps, b.ratelimitProblems(t, w, c)...)
			}
		}
		for name := range volumes {
			if !mounted[name] {
				add("%s: volume %s is mounted by no container", w, name)
			}
		}
	}

	for _, s := range objectsOf[*corev1.Service](b) {
		where := "Service " + s.Name
		targets := b.selected(s.Spec.Selector)
		if len(targets) == 0 {
			add("%s: selector %v matches no pod template", where, s.Spec.Selector)
		}
		for _, w := range targets {
			for _, p := range s.Spec.Ports {
				if _, ok := podPort(w, p.TargetPort); !ok {
					add("%s: port %s targets %s, which %s does not declare", where, p.Name, p.TargetPort.String(), w)
				}
			}
		}
	}
	for _, ss := range objectsOf[*appsv1.StatefulSet](b) {
		o := b.object("v1/Service", ss.Spec.ServiceName)
		if o == nil || o.obj.(*corev1.Service).Spec.ClusterIP != corev1.ClusterIPNone ||
			!selects(o.obj.(*corev1.Service).Spec.Selector, ss.Spec.Template.Labels) {
			add("StatefulSet %s: serviceName %q is not a headless Service selecting it", ss.Name, ss.Spec.ServiceName)
		}
	}

	hpaTargets := map[string]*autoscalingv2.HorizontalPodAutoscaler{}
	for _, h := range objectsOf[*autoscalingv2.HorizontalPodAutoscaler](b) {
		where := "HorizontalPodAutoscaler " + h.Name
		ref := h.Spec.ScaleTargetRef
		o := b.object("apps/v1/"+ref.Kind, ref.Name)
		if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || o == nil {
			add("%s: scaleTargetRef %s %s %s is not a Deployment of the build", where, ref.APIVersion, ref.Kind, ref.Name)
			continue
		}
		hpaTargets[ref.Name] = h
		d := o.obj.(*appsv1.Deployment)
		if d.Spec.Replicas != nil {
			add("%s: Deployment %s sets replicas, which every apply would reset", where, d.Name)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
			add("%s: minReplicas must be at least 2 and at most maxReplicas", where)
		}
		for _, m := range h.Spec.Metrics {
			if m.Type != autoscalingv2.ResourceMetricSourceType || m.Resource == nil {
				add("%s: metric %s: only Resource metrics are checked here", where, m.Type)
				continue
			}
			for _, c := range d.Spec.Template.Spec.Containers {
				if _, ok := c.Resources.Requests[m.Resource.Name]; !ok {
					add("%s: utilization of %s needs a request on container %s", where, m.Resource.Name, c.Name)
				}
			}
		}
	}
	for _, p := range objectsOf[*policyv1.PodDisruptionBudget](b) {
		where := "PodDisruptionBudget " + p.Name
		var target *appsv1.Deployment
		for _, d := range objectsOf[*appsv1.Deployment](b) {
			if p.Spec.Selector != nil && maps.Equal(p.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels) {
				target = d
			}
		}
		if target == nil {
			add("%s: selector %v is not the selector of a Deployment of the build", where, p.Spec.Selector)
			continue
		}
		if (p.Spec.MaxUnavailable == nil) == (p.Spec.MinAvailable == nil) {
			add("%s: set exactly one of maxUnavailable and minAvailable", where)
		}
		if p.Spec.MaxUnavailable != nil && p.Spec.MaxUnavailable.IntValue() < 1 {
			add("%s: maxUnavailable %s blocks every drain", where, p.Spec.MaxUnavailable.String())
		}
		if hpaTargets[target.Name] == nil && (target.Spec.Replicas == nil || *target.Spec.Replicas < 2) {
			add("%s: Deployment %s may run a single replica, which the budget would block", where, target.Name)
		}
	}
	for _, np := range objectsOf[*networkingv1.NetworkPolicy](b) {
		where := "NetworkPolicy " + np.Name
		targets := b.selected(np.Spec.PodSelector.MatchLabels)
		if len(targets) == 0 {
			add("%s: podSelector matches no pod template", where)
		}
		for _, rule := range np.Spec.Ingress {
			for _, port := range rule.Ports {
				for _, w := range targets {
					if port.Port == nil {
						continue
					}
					if _, ok := podPort(w, *port.Port); !ok {
						add("%s: port %s is not declared by %s", where, port.Port.String(), w)
					}
				}
			}
			for _, from := range rule.From {
				if from.PodSelector != nil && len(b.selected(from.PodSelector.MatchLabels)) == 0 {
					add("%s: from podSelector %v matches no pod template", where, from.PodSelector.MatchLabels)
				}
			}
		}
	}
	return ps
}

// redisProblems checks a Redis container's memory settings. An evicted
// counter admits again within its window, so Redis must refuse writes
// (noeviction: the service's failure modes answer) rather than evict, and
// maxmemory must leave the container room for what it does not count
// (fragmentation, client buffers, Lua), or the kernel kills Redis first.
func redisProblems(c *corev1.Container) []string {
	var ps []string
	f := flags(c.Args)
	if got := f["maxmemory-policy"]; got != "noeviction" {
		ps = append(ps, fmt.Sprintf("--maxmemory-policy %q: want noeviction (an evicted counter admits again)", got))
	}
	maxmemory, err := redisBytes(f["maxmemory"])
	limit, okLimit := c.Resources.Limits[corev1.ResourceMemory]
	switch {
	case err != nil || maxmemory == 0:
		ps = append(ps, fmt.Sprintf("--maxmemory %q: want a size below the memory limit (%v)", f["maxmemory"], err))
	case !okLimit:
		ps = append(ps, "no memory limit to size --maxmemory against")
	case maxmemory*4 > limit.Value()*3:
		ps = append(ps, fmt.Sprintf("--maxmemory %s is more than 3/4 of the memory limit %s", f["maxmemory"], limit.String()))
	}
	return ps
}

// redisBytes parses a Redis memory size: a number of bytes, or with k, kb,
// m, mb, g, gb (k = 1000, kb = 1024, as redis.conf says).
func redisBytes(v string) (int64, error) {
	v = strings.ToLower(v)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"gb", 1 << 30}, {"mb", 1 << 20}, {"kb", 1 << 10}, {"g", 1e9}, {"m", 1e6}, {"k", 1e3}} {
		if strings.HasSuffix(v, u.suffix) {
			v, mult = strings.TrimSuffix(v, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n * mult, err
}

// ratelimitProblems checks a container running this service against its
// flags, its config and the rest of the build.
func (b *bundle) ratelimitProblems(t *testing.T, w workload, c *corev1.Container) []string {
	t.Helper()
	var ps []string
	where := fmt.Sprintf("%s container %s", w, c.Name)
	add := func(format string, args ...any) { ps = append(ps, where+": "+fmt.Sprintf(format, args...)) }
	f := flags(c.Args)
	for _, name := range []string{"config", "grpc-addr", "http-addr", "drain-timeout"} {
		if f[name] == "" {
			add("--%s is not passed explicitly", name)
		}
	}

	// The rules: a whole ConfigMap mounted as the --config directory.
	var mount *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if m.MountPath == f["config"] {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		add("nothing is mounted at --config=%s", f["config"])
	} else {
		if mount.SubPath != "" || mount.SubPathExpr != "" {
			add("the config is mounted with subPath, which the kubelet never updates")
		}
		var vol *corev1.Volume
		for i := range w.template.Spec.Volumes {
			if w.template.Spec.Volumes[i].Name == mount.Name {
				vol = &w.template.Spec.Volumes[i]
			}
		}
		switch {
		case vol == nil || vol.ConfigMap == nil:
			add("--config is not a ConfigMap volume")
		case len(vol.ConfigMap.Items) > 0:
			add("the config volume picks items: mount the whole ConfigMap")
		default:
			cm, g := b.configMap(vol.ConfigMap.Name)
			if cm == nil {
				break // reported with the volumes
			}
			if g == nil || g.hashed {
				add("ConfigMap %s is not generated from %s with a stable name", cm.Name, rulesDir)
			}
			ps = append(ps, rulesConfigMapProblems(t, cm)...)
		}
	}

	// Ports, probes and the store.
	grpcPort, err := addrPort(f["grpc-addr"])
	if err != nil {
		add("--grpc-addr %q: %v", f["grpc-addr"], err)
	}
	if p, ok := containerPort(c, intstr.FromString("grpc")); !ok || p != grpcPort {
		add("container port grpc is %d, --grpc-addr listens on %d", p, grpcPort)
	}
	if httpPort, err := addrPort(f["http-addr"]); err != nil {
		add("--http-addr %q: %v", f["http-addr"], err)
	} else if _, ok := containerPort(c, intstr.FromInt32(httpPort)); !ok {
		add("--http-addr port %d is not a container port", httpPort)
	}
	healthServices := []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName}
	for kind, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.GRPC == nil || p.GRPC.Port != grpcPort {
			add("%s probe is not a gRPC probe on %d", kind, grpcPort)
		} else if !slices.Contains(healthServices, ptrValue(p.GRPC.Service)) {
			add("%s probe asks for health service %q, which the service does not register", kind, ptrValue(p.GRPC.Service))
		}
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.GRPC != nil && ptrValue(c.ReadinessProbe.GRPC.Service) != healthServices[1] {
		add("readiness probe should ask for %s", healthServices[1])
	}
	if _, set := f["store-timeout"]; set {
		// The service takes its deadline from Envoy's; a --store-timeout
		// below it would cut a burst's queueing short and answer by
		// failure mode what the deadline still had time for.
		add("--store-timeout is set: leave it at its default, Envoy's filter timeout governs")
	}

	// Stopping: the grace period covers the preStop sleeps and the drain.
	drain, err := time.ParseDuration(f["drain-timeout"])
	if err != nil {
		add("--drain-timeout %q: %v", f["drain-timeout"], err)
	}
	var delay time.Duration // --shutdown-delay, where the service has it: serving while NOT_SERVING
	if v, ok := f["shutdown-delay"]; ok {
		if delay, err = time.ParseDuration(v); err != nil {
			add("--shutdown-delay %q: %v", v, err)
		}
	}
	grace := time.Duration(ptrValue(w.template.Spec.TerminationGracePeriodSeconds)) * time.Second
	if need := preStopSleep(w) + delay + drain; grace <= need {
		add("terminationGracePeriodSeconds %v is not longer than the preStop sleep plus --drain-timeout (%v)", grace, need)
	}

	// Redis: a Service of the build, on a port its pods serve, and a
	// NetworkPolicy (when there is one) that admits this pod.
	var redisURL string
	for _, e := range c.Env {
		if e.Name == "RATELIMIT_REDIS_URL" {
			redisURL = e.Value
		}
	}
	u, err := url.Parse(redisURL)
	if err != nil || u.Scheme != "redis" && u.Scheme != "rediss" {
		add("RATELIMIT_REDIS_URL %q is not a redis:// URL", redisURL)
		return ps
	}
	port, _ := strconv.ParseInt(u.Port(), 10, 32)
	svcObj := b.object("v1/Service", u.Hostname())
	if svcObj == nil {
		add("RATELIMIT_REDIS_URL host %s is not a Service of the build", u.Hostname())
		return ps
	}
	svc := svcObj.obj.(*corev1.Service)
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Port == int32(port) {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		add("RATELIMIT_REDIS_URL port %d is not a port of Service %s", port, svc.Name)
		return ps
	}
	for _, np := range objectsOf[*networkingv1.NetworkPolicy](b) {
		for _, rw := range b.selected(np.Spec.PodSelector.MatchLabels) {
			if !selects(svc.Spec.Selector, rw.template.Labels) {
				continue
			}
			admitted := false
			for _, rule := range np.Spec.Ingress {
				for _, from := range rule.From {
					if from.PodSelector != nil && selects(from.PodSelector.MatchLabels, w.template.Labels) {
						admitted = true
					}
				}
			}
			if !admitted {
				add("NetworkPolicy %s does not admit this pod to %s", np.Name, rw)
			}
		}
	}
	return ps
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// rulesConfigMapProblems checks that a rules ConfigMap holds exactly the files
// of deploy/config, byte for byte, and that the service loads it the way the
// kubelet mounts it: the files are symlinks into a "..data" directory.
func rulesConfigMapProblems(t *testing.T, cm *corev1.ConfigMap) []string {
	t.Helper()
	var ps []string
	keys := slices.Sorted(maps.Keys(cm.Data))
	if want := ruleFiles(t); !slices.Equal(keys, want) {
		ps = append(ps, fmt.Sprintf("ConfigMap %s has keys %v, want the rule files of %s: %v", cm.Name, keys, rulesDir, want))
	}
	for _, k := range keys {
		if want, err := os.ReadFile(filepath.Join(rulesDir, k)); err != nil || cm.Data[k] != string(want) {
			ps = append(ps, fmt.Sprintf("ConfigMap %s: %s differs from %s/%s", cm.Name, k, rulesDir, k))
		}
	}
	dir := t.TempDir()
	stamp := filepath.Join(dir, "..2026_01_01_00_00_00.000000001")
	if err := os.Mkdir(stamp, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := os.WriteFile(filepath.Join(stamp, k), []byte(cm.Data[k]), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(stamp), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	got, err := config.Load(dir, config.Defaults{})
	if err != nil {
		return append(ps, fmt.Sprintf("ConfigMap %s, mounted: %v", cm.Name, err))
	}
	var gotRules, wantRules []string
	for _, r := range got.Rules() {
		gotRules = append(gotRules, fmt.Sprintf("%s %s %d/%s", r, r.Name, r.RequestsPerUnit, r.Unit))
	}
	for _, r := range loadRules(t).Rules() {
		wantRules = append(wantRules, fmt.Sprintf("%s %s %d/%s", r, r.Name, r.RequestsPerUnit, r.Unit))
	}
	if !slices.Equal(gotRules, wantRules) || len(got.Files()) != len(keys) {
		ps = append(ps, fmt.Sprintf("ConfigMap %s, mounted, loads rules %v from %d files; want %v from %d", cm.Name, gotRules, len(got.Files()), wantRules, len(keys)))
	}
	return ps
}

func requireNoProblems(t *testing.T, b *bundle) {
	t.Helper()
	for _, p := range b.problems(t) {
		t.Errorf("%s: %s", b.dir, p)
	}
}

// ---------------------------------------------------------------------------
// Tests.

func TestKustomizeRulesConfigMap(t *testing.T) {
	b := build(t, rulesDir)
	if len(b.objects) != 1 {
		t.Fatalf("%s builds %d objects, want the one ConfigMap", rulesDir, len(b.objects))
	}
	cm, g := b.configMap("ratelimit-config")
	if cm == nil || g == nil {
		t.Fatalf("%s does not generate ConfigMap ratelimit-config", rulesDir)
	}
	if g.hashed {
		t.Error("ratelimit-config gets a hash suffix: an update would create a new ConfigMap, not swap the mounted one")
	}
	for _, p := range rulesConfigMapProblems(t, cm) {
		t.Error(p)
	}
}

func TestKustomizeSidecar(t *testing.T) {
	b := build(t, filepath.Join(k8sDir, "sidecar"))
	requireNoProblems(t, b)

	o := b.object("apps/v1/Deployment", "app")
	if o == nil {
		t.Fatal("no Deployment app")
	}
	w := workload{"Deployment", "app", o.obj.(*appsv1.Deployment).Spec.Selector, &o.obj.(*appsv1.Deployment).Spec.Template}
	rl, envoy, app := w.container("ratelimit"), w.container("envoy"), w.container("app")
	if rl == nil || envoy == nil || app == nil {
		t.Fatal("the app pod needs containers ratelimit, envoy and app")
	}
	if rl.RestartPolicy == nil || *rl.RestartPolicy != corev1.ContainerRestartPolicyAlways || !slices.ContainsFunc(w.template.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == "ratelimit" }) {
		t.Error("ratelimit is not a native sidecar (an init container with restartPolicy Always): Envoy could start before it or outlive it")
	}
	if rl.StartupProbe == nil || rl.StartupProbe.GRPC == nil {
		t.Error("the ratelimit sidecar has no gRPC startup probe: the app containers would not wait for it to serve")
	}

	// Envoy's bootstrap: deploy/envoy.yaml byte for byte, mounted where -c
	// reads it, rolled out on change.
	cm, g := b.configMap("envoy-config")
	if cm == nil || g == nil {
		t.Fatal("no generated ConfigMap envoy-config")
	}
	if !g.hashed {
		t.Error("envoy-config has a stable name: a change would not restart Envoy, which reads its bootstrap only at start")
	}
	envoyYAML := string(readFile(t, envoyFile))
	if len(cm.Data) != 1 || cm.Data["envoy.yaml"] != envoyYAML {
		t.Errorf("envoy-config data is not %s byte for byte: cp %s %s", envoyFile, envoyFile, g.files["envoy.yaml"])
	}
	ef := flags(envoy.Args)
	var envoyMount *corev1.VolumeMount
	for i, m := range envoy.VolumeMounts {
		if strings.HasPrefix(ef["c"], m.MountPath+"/") {
			envoyMount = &envoy.VolumeMounts[i]
		}
	}
	if envoyMount == nil || strings.TrimPrefix(ef["c"], envoyMount.MountPath+"/") != "envoy.yaml" {
		t.Errorf("envoy -c %q is not envoy.yaml of a mounted volume", ef["c"])
	} else if v := volumeNamed(w, envoyMount.Name); v == nil || v.ConfigMap == nil || v.ConfigMap.Name != "envoy-config" {
		t.Errorf("envoy's config volume %s is not ConfigMap envoy-config", envoyMount.Name)
	}
	if _, ok := ef["disable-hot-restart"]; !ok {
		t.Error("envoy runs without --disable-hot-restart")
	}

	// The image is the Envoy release whose API the tests validate against.
	if proto := envoyAPIVersion(t); !strings.HasPrefix(strings.TrimPrefix(envoy.Image, "envoyproxy/envoy:"), proto+".") {
		t.Errorf("envoy image %s, but %s is validated with the protos of Envoy %s (go-control-plane/envoy in go.mod): move them together", envoy.Image, envoyFile, proto)
	}

	// Ports line up with the bootstrap.
	bs, _ := loadBootstrap(t)
	e := newEdge(t, bs)
	svc := b.object("v1/Service", "app").obj.(*corev1.Service)
	if len(svc.Spec.Ports) != 1 {
		t.Errorf("Service app exposes %d ports, want only Envoy's listener", len(svc.Spec.Ports))
	}
	for _, p := range svc.Spec.Ports {
		if n, ok := containerPort(envoy, p.TargetPort); !ok || uint32(n) != e.listenerPort {
			t.Errorf("Service app port %s targets %s, want Envoy's listener %d", p.Name, p.TargetPort.String(), e.listenerPort)
		}
	}
	for _, np := range objectsOf[*networkingv1.NetworkPolicy](b) {
		if !selects(np.Spec.PodSelector.MatchLabels, w.template.Labels) {
			continue
		}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if n, ok := containerPort(envoy, *p.Port); !ok || uint32(n) != e.listenerPort {
					t.Errorf("NetworkPolicy %s admits port %s, want only Envoy's listener %d", np.Name, p.Port.String(), e.listenerPort)
				}
			}
		}
	}
	endpoint := func(cluster string) (string, uint32) {
		sa := e.clusters[cluster].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		return sa.GetAddress(), sa.GetPortValue()
	}
	grpcPort, _ := containerPort(rl, intstr.FromString("grpc"))
	if host, port := endpoint(e.filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()); host != "127.0.0.1" || port != uint32(grpcPort) {
		t.Errorf("Envoy's rate limit cluster is %s:%d, the sidecar serves gRPC on 127.0.0.1:%d", host, port, grpcPort)
	}
	appListen := flags(app.Args)["listen"]
	if host, port := endpoint(e.vhost.GetRoutes()[0].GetRoute().GetCluster()); appListen != net.JoinHostPort(host, strconv.Itoa(int(port))) || host != "127.0.0.1" {
		t.Errorf("Envoy's app cluster is %s:%d, the app listens on %q (want loopback, the same address)", host, port, appListen)
	}

	// The readiness probe is not rate limited: it reaches the app through
	// Envoy on a route without rate_limits.
	rp := envoy.ReadinessProbe
	if rp == nil || rp.HTTPGet == nil {
		t.Fatal("envoy has no HTTP readiness probe")
	}
	if n, _ := containerPort(envoy, rp.HTTPGet.Port); uint32(n) != e.listenerPort {
		t.Errorf("envoy's readiness probe goes to port %d, not the listener %d", n, e.listenerPort)
	}
	if got := e.emulate(t, request{"GET", rp.HTTPGet.Path, nil, "10.0.0.1"}); got.route == "" || len(got.descriptors) > 0 {
		t.Errorf("readiness probe GET %s: route %q, descriptors %q: want a route without rate limits", rp.HTTPGet.Path, got.route, descStrings(got.descriptors))
	}
}

func TestKustomizeCentral(t *testing.T) {
	b := build(t, filepath.Join(k8sDir, "central"))
	requireNoProblems(t, b)

	for _, id := range []string{
		"apps/v1/Deployment ratelimit", "v1/Service ratelimit", "v1/Service ratelimit-headless",
		"policy/v1/PodDisruptionBudget ratelimit", "autoscaling/v2/HorizontalPodAutoscaler ratelimit",
		"v1/ConfigMap ratelimit-config", "apps/v1/StatefulSet redis", "v1/Service redis",
	} {
		kind, name, _ := strings.Cut(id, " ")
		if b.object(kind, name) == nil {
			t.Errorf("no %s", id)
		}
	}
	d := b.object("apps/v1/Deployment", "ratelimit").obj.(*appsv1.Deployment)
	w := workload{"Deployment", d.Name, d.Spec.Selector, &d.Spec.Template}
	rl := w.container("ratelimit")
	if rl == nil {
		t.Fatal("no container ratelimit")
	}
	svc := b.object("v1/Service", "ratelimit").obj.(*corev1.Service)
	var names []string
	for _, p := range svc.Spec.Ports {
		n, _ := containerPort(rl, p.TargetPort)
		names = append(names, fmt.Sprintf("%s:%d", p.Name, n))
	}
	if want := []string{"grpc:8081", "http:8080"}; !slices.Equal(names, want) {
		t.Errorf("Service ratelimit ports %v, want %v", names, want)
	}

	// The docs' Envoy cluster resolves the headless Service, on its gRPC port.
	c := docsCentralCluster(t)
	sa := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	host, _, _ := strings.Cut(sa.GetAddress(), ".")
	o := b.object("v1/Service", host)
	if o == nil {
		t.Fatalf("the docs' central cluster resolves %s: no Service %s", sa.GetAddress(), host)
	}
	hs := o.obj.(*corev1.Service)
	if hs.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s is not headless: Envoy would see one address and pin its connection to one pod", hs.Name)
	}
	if len(hs.Spec.Ports) != 1 || uint32(hs.Spec.Ports[0].Port) != sa.GetPortValue() {
		t.Errorf("Service %s ports %v, the docs' cluster dials %d", hs.Name, hs.Spec.Ports, sa.GetPortValue())
	} else if n, _ := containerPort(rl, hs.Spec.Ports[0].TargetPort); n != 8081 || hs.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s should reach only ready pods' gRPC port", hs.Name)
	}
}

// TestKustomizeChecksCatchMistakes breaks the builds in typical ways and
// expects the checks to say so.
func TestKustomizeChecksCatchMistakes(t *testing.T) {
	deployment := func(b *bundle, name string) *appsv1.Deployment {
		return b.object("apps/v1/Deployment", name).obj.(*appsv1.Deployment)
	}
	container := func(b *bundle, dep, name string) *corev1.Container {
		d := deployment(b, dep)
		return workload{"Deployment", d.Name, d.Spec.Selector, &d.Spec.Template}.container(name)
	}
	for _, tt := range []struct {
		name    string
		dir     string
		mutate  func(b *bundle)
		problem string
	}{
		{"service selector typo", "central", func(b *bundle) {
			b.object("v1/Service", "ratelimit").obj.(*corev1.Service).Spec.Selector["app.kubernetes.io/name"] = "ratelimt"
		}, "matches no pod template"},
		{"service target port", "central", func(b *bundle) {
			b.object("v1/Service", "ratelimit").obj.(*corev1.Service).Spec.Ports[0].TargetPort = intstr.FromString("gprc")
		}, "does not declare"},
		{"probe port", "central", func(b *bundle) {
			container(b, "ratelimit", "ratelimit").LivenessProbe.GRPC.Port = 9090
		}, "livenessProbe port 9090 is not a port of the container"},
		{"grace period", "central", func(b *bundle) {
			deployment(b, "ratelimit").Spec.Template.Spec.TerminationGracePeriodSeconds = ptr(int64(10))
		}, "terminationGracePeriodSeconds 10s is not longer"},
		{"drain timeout not explicit", "sidecar", func(b *bundle) {
			c := container(b, "app", "ratelimit")
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--drain-timeout") })
		}, "--drain-timeout is not passed explicitly"},
		{"store timeout set", "central", func(b *bundle) {
			c := container(b, "ratelimit", "ratelimit")
			c.Args = append(c.Args, "--store-timeout=15ms")
		}, "--store-timeout is set"},
		{"config volume typo", "sidecar", func(b *bundle) {
			deployment(b, "app").Spec.Template.Spec.Volumes[0].ConfigMap.Name = "ratelimit-conf"
		}, `ConfigMap "ratelimit-conf" is not in the build`},
		{"config path", "sidecar", func(b *bundle) {
			container(b, "app", "ratelimit").Args[0] = "--config=/etc/ratelimit"
		}, "nothing is mounted at --config=/etc/ratelimit"},
		{"config subPath", "central", func(b *bundle) {
			container(b, "ratelimit", "ratelimit").VolumeMounts[0].SubPath = "edge.yaml"
		}, "subPath"},
		{"rules drift", "central", func(b *bundle) {
			cm, _ := b.configMap("ratelimit-config")
			cm.Data["edge.yaml"] = strings.Replace(cm.Data["edge.yaml"], "requests_per_unit: 5\n", "requests_per_unit: 50\n", 1)
		}, "edge.yaml differs"},
		{"hpa target", "central", func(b *bundle) {
			objectsOf[*autoscalingv2.HorizontalPodAutoscaler](b)[0].Spec.ScaleTargetRef.Name = "rate-limit"
		}, "is not a Deployment of the build"},
		{"replicas with hpa", "central", func(b *bundle) {
			deployment(b, "ratelimit").Spec.Replicas = ptr(int32(3))
		}, "sets replicas"},
		{"pdb selector", "central", func(b *bundle) {
			objectsOf[*policyv1.PodDisruptionBudget](b)[0].Spec.Selector.MatchLabels["app.kubernetes.io/instance"] = "other"
		}, "is not the selector of a Deployment"},
		{"writable root", "sidecar", func(b *bundle) {
			container(b, "app", "envoy").SecurityContext.ReadOnlyRootFilesystem = nil
		}, "readOnlyRootFilesystem is not true"},
		{"no limits", "sidecar", func(b *bundle) {
			container(b, "app", "app").Resources.Limits = nil
		}, "resources need requests and limits of cpu"},
		{"limit below request", "central", func(b *bundle) {
			container(b, "ratelimit", "ratelimit").Resources.Limits[corev1.ResourceMemory] = resource.MustParse("16Mi")
		}, "memory limit 16Mi below request 64Mi"},
		{"redis not admitted", "central", func(b *bundle) {
			delete(deployment(b, "ratelimit").Spec.Template.Labels, "ratelimit/redis-client")
		}, "does not admit this pod"},
		{"redis url host", "sidecar", func(b *bundle) {
			container(b, "app", "ratelimit").Env[0].Value = "redis://redis-master:6379/0"
		}, "is not a Service of the build"},
		{"redis evicts", "central", func(b *bundle) {
			c := redisContainer(b)
			c.Args[slices.Index(c.Args, "--maxmemory-policy")+1] = "volatile-ttl"
		}, `--maxmemory-policy "volatile-ttl": want noeviction`},
		{"redis maxmemory at the limit", "central", func(b *bundle) {
			c := redisContainer(b)
			c.Args[slices.Index(c.Args, "--maxmemory")+1] = "256mb"
		}, "--maxmemory 256mb is more than 3/4 of the memory limit"},
		{"redis without maxmemory", "central", func(b *bundle) {
			c := redisContainer(b)
			i := slices.Index(c.Args, "--maxmemory")
			c.Args = slices.Delete(c.Args, i, i+2)
		}, `--maxmemory "": want a size`},
		{"unpinned image", "sidecar", func(b *bundle) {
			container(b, "app", "envoy").Image = "envoyproxy/envoy:latest"
		}, "is not pinned"},
		{"missing label", "central", func(b *bundle) {
			delete(b.object("v1/Service", "ratelimit-headless").labels, "app.kubernetes.io/part-of")
		}, "no label app.kubernetes.io/part-of"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := build(t, filepath.Join(k8sDir, tt.dir))
			tt.mutate(b)
			ps := b.problems(t)
			if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tt.problem) }) {
				t.Errorf("no problem mentions %q; got:\n  %s", tt.problem, strings.Join(ps, "\n  "))
			}
		})
	}

	// Decoding is strict, and only known kinds pass.
	for _, tt := range []struct{ name, doc, err string }{
		{"unknown field", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replica: 2}\n", "unknown field"},
		{"misplaced field", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 80, containerPort: 80}]}\n", "unknown field"},
		{"unknown kind", "apiVersion: v1\nkind: Servce\nmetadata: {name: x}\n", "unknown apiVersion/kind"},
		{"old api version", "apiVersion: autoscaling/v1\nkind: HorizontalPodAutoscaler\nmetadata: {name: x}\n", "unknown apiVersion/kind"},
		{"duplicate key", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\nmetadata: {name: y}\n", `key "metadata" already set`},
		{"namespace", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: default}\n", "namespace"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeManifest("test.yaml", []byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("error %v, want one containing %q", err, tt.err)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func redisContainer(b *bundle) *corev1.Container {
	return &b.object("apps/v1/StatefulSet", "redis").obj.(*appsv1.StatefulSet).Spec.Template.Spec.Containers[0]
}

func volumeNamed(w workload, name string) *corev1.Volume {
	for i := range w.template.Spec.Volumes {
		if w.template.Spec.Volumes[i].Name == name {
			return &w.template.Spec.Volumes[i]
		}
	}
	return nil
}

// envoyAPIVersion returns "vMAJOR.MINOR" of the go-control-plane/envoy module
// the tests are built with: the Envoy release whose API they validate.
func envoyAPIVersion(t *testing.T) string {
	t.Helper()
	list := exec.Command(goTool(t), "list", "-m", "-f", "{{.Version}}", "github.com/envoyproxy/go-control-plane/envoy")
	list.Dir = repoRoot
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list -m github.com/envoyproxy/go-control-plane/envoy: %v", err)
	}
	version := strings.TrimSpace(string(out))
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 3 {
		t.Fatalf("go-control-plane/envoy version %q", version)
	}
	return parts[0] + "." + parts[1]
}
