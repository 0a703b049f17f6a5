package kubetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Applier server-side applies manifests as the admin, with strict field
// validation, so a misspelt or misplaced field is an error as `kubectl
// apply --server-side` would report it. With DryRun nothing is stored, but
// every admission plugin (PodSecurity included) still runs.
type Applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
	dryRun bool

	mu       sync.Mutex
	warnings []string
}

// NewApplier returns an Applier on c; dryRun makes every apply a server-side dry run.
func NewApplier(c *Cluster, dryRun bool) (*Applier, error) {
	a := &Applier{dryRun: dryRun}
	rc := c.RESTConfig(AdminToken)
	rc.WarningHandler = a // PodSecurity "would violate" warnings, deprecated fields
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	a.dyn, a.mapper = dyn, restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	return a, nil
}

var _ rest.WarningHandler = (*Applier)(nil)

// HandleWarningHeader records the API server's warnings.
func (a *Applier) HandleWarningHeader(code int, agent, text string) {
	if code != 299 || text == "" {
		return
	}
	a.mu.Lock()
	a.warnings = append(a.warnings, text)
	a.mu.Unlock()
}

// TakeWarnings returns the warnings received since the last call.
func (a *Applier) TakeWarnings() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.warnings
	a.warnings = nil
	return w
}

// Reset forgets cached API discovery (after installing CRDs).
func (a *Applier) Reset() { a.mapper.Reset() }

// Apply applies every document of r; it returns the objects' kinds/names.
func (a *Applier) Apply(ctx context.Context, r io.Reader) ([]string, error) {
	dec := yaml.NewYAMLOrJSONDecoder(r, 4096)
	var done []string
	for {
		var o unstructured.Unstructured
		if err := dec.Decode(&o.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return done, nil
			}
			return done, fmt.Errorf("decode: %w", err)
		}
		if len(o.Object) == 0 {
			continue
		}
		if err := a.ApplyObject(ctx, &o); err != nil {
			return done, err
		}
		done = append(done, o.GetKind()+"/"+o.GetName())
	}
}

// ApplyObject applies one object.
func (a *Applier) ApplyObject(ctx context.Context, o *unstructured.Unstructured) error {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s: %w", gvk, err)
	}
	body, err := o.MarshalJSON()
	if err != nil {
		return fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err)
	}
	force := true
	opts := metav1.PatchOptions{FieldManager: "turnout-deploy-test", FieldValidation: "Strict", Force: &force}
	if a.dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	if _, err := a.dyn.Resource(m.Resource).Namespace(o.GetNamespace()).Patch(ctx, o.GetName(), types.ApplyPatchType, body, opts); err != nil {
		return fmt.Errorf("apply %s %s: %w", gvk.Kind, o.GetName(), err)
	}
	return nil
}

// HelmVersion is the Helm version scripts/helm.sh builds.
const HelmVersion = "v3.22.0"

// HelmPath is where scripts/helm.sh leaves the helm binary: $HELM, else
// the cache of APIServerPath keyed by HelmVersion.
func HelmPath() string { return cachedBin("HELM", "helm-"+HelmVersion) }

// Helm returns the helm binary, or skips the test (fails it when RequireEnv is set).
func Helm(t testing.TB) string {
	t.Helper()
	p := HelmPath()
	if _, err := os.Stat(p); err != nil {
		Skip(t, fmt.Sprintf("helm not built (%s): run make helm (.ci/run does): skipping chart test", p))
	}
	return p
}
