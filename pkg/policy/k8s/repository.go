package k8s

import (
	"fmt"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/tendril-net/tendril/pkg/policy"
)

// Apply translates np and puts its rules into repo in place of those of
// the previous version of the object, in one revision. When np is refused,
// nothing changes and the previous version's rules stay: the caller
// decides what a refused update means.
func Apply(repo *policy.Repository, np *networkingv1.NetworkPolicy) (uint64, error) {
	rules, err := Translate(np)
	if err != nil {
		return 0, err
	}
	rev, err := repo.ReplaceByLabels(KeyLabels(np.Namespace, np.Name), rules, np.Namespace, Source(np.Namespace, np.Name))
	if err != nil {
		return 0, fmt.Errorf("apply NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
	}
	return rev, nil
}

// Delete removes the rules of the NetworkPolicy namespace/name and returns
// the revision and how many rules went.
func Delete(repo *policy.Repository, namespace, name string) (uint64, int) {
	return repo.DeleteByLabels(KeyLabels(namespace, name))
}
