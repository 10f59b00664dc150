package identitygc

import "k8s.io/apimachinery/pkg/labels"

type labelsSelector = labels.Selector

func labelsEverything() labels.Selector { return labels.Everything() }
