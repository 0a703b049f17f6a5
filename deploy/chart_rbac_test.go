package deploy_test

import (
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/turnout/turnout/lab/testenv/kubetest"
)

// The chart's Role grants what the profile's pools read: inferencepools
// (kubetest.InferencePoolRule, which the Kubernetes tests bind) and pods
// exactly when a pool uses inference_pool, pods also for role_label.
func TestChartRBACFollowsDiscovery(t *testing.T) {
	helm := kubetest.Helm(t)
	for _, prof := range profiles {
		objs := render(t, helm, prof, "llm")
		p, err := podOf(objs)
		if err != nil {
			t.Fatalf("profile %s: %v", prof, err)
		}
		var ipool, pods bool
		for _, d := range p.cfg.Deployments {
			for _, pl := range d.Pools {
				if k := pl.Discovery; k != nil && k.Kubernetes != nil {
					ipool = ipool || k.Kubernetes.InferencePool != ""
					pods = pods || k.Kubernetes.InferencePool != "" || k.Kubernetes.RoleLabel != ""
				}
			}
		}
		var rules []rbacv1.PolicyRule
		for _, o := range objs {
			if o.GetKind() != "Role" && o.GetKind() != "ClusterRole" {
				continue
			}
			var r rbacv1.Role
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
				t.Fatalf("profile %s: %v", prof, err)
			}
			rules = append(rules, r.Rules...)
		}
		grants := func(want rbacv1.PolicyRule) bool {
			return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
				return slices.Equal(r.APIGroups, want.APIGroups) && slices.Equal(r.Resources, want.Resources) && slices.Equal(r.Verbs, want.Verbs)
			})
		}
		podRule := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}
		if got := grants(kubetest.InferencePoolRule); got != ipool {
			t.Errorf("profile %s: inferencepools granted %v, a pool uses inference_pool %v (rules %+v)", prof, got, ipool, rules)
		}
		if got := grants(podRule); got != pods {
			t.Errorf("profile %s: pods granted %v, want %v (rules %+v)", prof, got, pods, rules)
		}
	}
	if !slices.Contains(profiles, "inferencepool") {
		t.Error("no profile uses inference_pool")
	}
}
