package train

import (
	"reflect"

	"distflash/model"
)

// The model's side of issue 41's one-sync step, used where the model has it: Model.FreshGrads
// (the next ForwardBackward overwrites each weight gradient with its first contribution, beta
// 0, so the caller skips ZeroGrads; the model clears it after the call; not for an FSDP store),
// Model.DeferLoss with Model.TakeLoss (ForwardBackward leaves its per-token losses on the
// device and returns a loss sum of 0 and the count; TakeLoss downloads every pending call's
// losses in one Download and returns their sum, in call order, equal to the sum the calls
// would have returned). A model without them trains as before: ZeroGrads, and each
// ForwardBackward's own download of its losses.
//
// They are looked up by name, not named in code, so that this package builds and trains the
// same against a model with or without them while the two are built apart; once the model
// has them, these three functions become the plain field and method uses they stand for.

// lossTaker is a model that can hand over its deferred losses (model.Model.TakeLoss).
type lossTaker interface{ TakeLoss() float64 }

// setFlag sets m's bool field name to v and reports whether m has such a field.
func setFlag(m *model.Model, name string, v bool) bool {
	f := reflect.ValueOf(m).Elem().FieldByName(name)
	if !f.IsValid() || f.Kind() != reflect.Bool || !f.CanSet() {
		return false
	}
	f.SetBool(v)
	return true
}

// freshGrads asks m's next ForwardBackward to overwrite the weight gradients rather than add
// to them (model.Model.FreshGrads) and reports whether m can; when it cannot the caller zeroes
// them.
func freshGrads(m *model.Model) bool { return setFlag(m, "FreshGrads", true) }

// deferLoss sets whether m's ForwardBackward leaves its losses on the device
// (model.Model.DeferLoss) and reports whether m can (then takeLoss brings them down).
func deferLoss(m *model.Model, on bool) bool {
	if _, ok := any(m).(lossTaker); !ok {
		return false
	}
	return setFlag(m, "DeferLoss", on)
}

// takeLoss downloads the losses m's ForwardBackward calls left on the device since the last
// takeLoss, in one Download, and returns their sum (model.Model.TakeLoss). Only after
// deferLoss reported true.
func takeLoss(m *model.Model) float64 { return any(m).(lossTaker).TakeLoss() }
