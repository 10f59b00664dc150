package kubelet

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestWorkloadPorts(t *testing.T) {
	none := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a"}}}}
	tcp, udp := workloadPorts(none)
	if !reflect.DeepEqual(tcp, []int{80, 81}) || !reflect.DeepEqual(udp, []int{80, 81}) {
		t.Errorf("no declared ports: tcp %v udp %v, want 80,81 on both", tcp, udp)
	}
	declared := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "a", Ports: []corev1.ContainerPort{{ContainerPort: 8080}, {ContainerPort: 53, Protocol: corev1.ProtocolUDP}}},
		{Name: "b", Ports: []corev1.ContainerPort{{ContainerPort: 443, Protocol: corev1.ProtocolTCP}, {ContainerPort: 8080, Protocol: corev1.ProtocolTCP}, {ContainerPort: 9, Protocol: corev1.ProtocolSCTP}}},
	}}}
	tcp, udp = workloadPorts(declared)
	if !reflect.DeepEqual(tcp, []int{443, 8080}) || !reflect.DeepEqual(udp, []int{53}) {
		t.Errorf("declared ports: tcp %v udp %v", tcp, udp)
	}
}

func TestContainerIDIsStablePerUID(t *testing.T) {
	a, b := containerID("uid-1"), containerID("uid-1")
	if a != b || len(a) != 64 || a == containerID("uid-2") {
		t.Errorf("containerID: %s %s", a, b)
	}
}

func TestNodeSelectorMatches(t *testing.T) {
	labels := map[string]string{"kubernetes.io/hostname": "node2", "kubernetes.io/os": "linux"}
	if !matches(nil, labels) || !matches(map[string]string{"kubernetes.io/hostname": "node2"}, labels) {
		t.Error("a matching selector did not match")
	}
	if matches(map[string]string{"kubernetes.io/hostname": "node1"}, labels) {
		t.Error("a selector for another node matched")
	}
}
