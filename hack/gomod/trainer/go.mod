module lockstep.dev/hack/gomod/trainer

go 1.26

require github.com/kubeflow/trainer/v2 v2.1.0 // indirect
