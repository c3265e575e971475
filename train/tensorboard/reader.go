package tensorboard

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Event is one decoded event of an event file.
type Event struct {
	// WallTime is the event's time in seconds since the Unix epoch.
	WallTime float64
	// Step is the training step of the event.
	Step int64
	// FileVersion is set on the record that opens a file, such as "brain.Event:2".
	FileVersion string
	// Values holds the summary's simple values by tag; it is nil for an event without a
	// summary. Values of other kinds (images, histograms, tensors) are left out.
	Values map[string]float32
}

// eventDescriptor is the descriptor of the tensorboard.Event message, built once at run time
// from the subset of event.proto and summary.proto that scalars use.
var eventDescriptor = sync.OnceValues(buildEventDescriptor)

// buildEventDescriptor builds the descriptors of Event, Summary and Summary.Value as
// TensorBoard's protos declare them (file_version and summary in the oneof "what",
// simple_value in the oneof "value"), independently of the writer's hand encoding.
func buildEventDescriptor() (protoreflect.MessageDescriptor, error) {
	field := func(name string, num int32, typ descriptorpb.FieldDescriptorProto_Type, label descriptorpb.FieldDescriptorProto_Label, typeName string, oneof *int32) *descriptorpb.FieldDescriptorProto {
		f := &descriptorpb.FieldDescriptorProto{
			Name:       proto.String(name),
			JsonName:   proto.String(jsonName(name)),
			Number:     proto.Int32(num),
			Type:       typ.Enum(),
			Label:      label.Enum(),
			OneofIndex: oneof,
		}
		if typeName != "" {
			f.TypeName = proto.String(typeName)
		}
		return f
	}
	const opt = descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL
	const rep = descriptorpb.FieldDescriptorProto_LABEL_REPEATED
	fd := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("distflash/tensorboard/event.proto"),
		Package: proto.String("tensorboard"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{
				Name: proto.String("Event"),
				Field: []*descriptorpb.FieldDescriptorProto{
					field("wall_time", 1, descriptorpb.FieldDescriptorProto_TYPE_DOUBLE, opt, "", nil),
					field("step", 2, descriptorpb.FieldDescriptorProto_TYPE_INT64, opt, "", nil),
					field("file_version", 3, descriptorpb.FieldDescriptorProto_TYPE_STRING, opt, "", proto.Int32(0)),
					field("summary", 5, descriptorpb.FieldDescriptorProto_TYPE_MESSAGE, opt, ".tensorboard.Summary", proto.Int32(0)),
				},
				OneofDecl: []*descriptorpb.OneofDescriptorProto{{Name: proto.String("what")}},
			},
			{
				Name: proto.String("Summary"),
				Field: []*descriptorpb.FieldDescriptorProto{
					field("value", 1, descriptorpb.FieldDescriptorProto_TYPE_MESSAGE, rep, ".tensorboard.Summary.Value", nil),
				},
				NestedType: []*descriptorpb.DescriptorProto{{
					Name: proto.String("Value"),
					Field: []*descriptorpb.FieldDescriptorProto{
						field("tag", 1, descriptorpb.FieldDescriptorProto_TYPE_STRING, opt, "", nil),
						field("simple_value", 2, descriptorpb.FieldDescriptorProto_TYPE_FLOAT, opt, "", proto.Int32(0)),
					},
					OneofDecl: []*descriptorpb.OneofDescriptorProto{{Name: proto.String("value")}},
				}},
			},
		},
	}
	file, err := protodesc.NewFile(fd, new(protoregistry.Files))
	if err != nil {
		return nil, fmt.Errorf("tensorboard: build event descriptor: %w", err)
	}
	md := file.Messages().ByName("Event")
	if md == nil {
		return nil, fmt.Errorf("tensorboard: build event descriptor: no message Event")
	}
	return md, nil
}

// jsonName is the lowerCamelCase JSON name protoc gives a snake_case field name.
func jsonName(name string) string {
	b := make([]byte, 0, len(name))
	up := false
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '_':
			up = true
		case up && 'a' <= c && c <= 'z':
			b = append(b, c-'a'+'A')
			up = false
		default:
			b = append(b, c)
			up = false
		}
	}
	return string(b)
}

// ReadFile reads every event of the event file at path. It checks the framing of every
// record and both of its checksums; an error names the file, the record's index (from 0) and
// its byte offset.
func ReadFile(path string) ([]Event, error) {
	md, err := eventDescriptor()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tensorboard: %w", err)
	}
	fields := md.Fields()
	fWall, fStep := fields.ByName("wall_time"), fields.ByName("step")
	fVersion, fSummary := fields.ByName("file_version"), fields.ByName("summary")
	fValue := fSummary.Message().Fields().ByName("value")
	vfields := fValue.Message().Fields()
	fTag, fSimple := vfields.ByName("tag"), vfields.ByName("simple_value")

	var events []Event
	for off, i := 0, 0; off < len(data); i++ {
		bad := func(format string, args ...any) error {
			return fmt.Errorf("tensorboard: %s: record %d at byte %d: %s", path, i, off, fmt.Sprintf(format, args...))
		}
		rest := data[off:]
		if len(rest) < 12 {
			return nil, bad("truncated header: %d of 12 bytes", len(rest))
		}
		if got, want := binary.LittleEndian.Uint32(rest[8:12]), maskedCRC(rest[:8]); got != want {
			return nil, bad("length CRC %#08x, want %#08x", got, want)
		}
		n := binary.LittleEndian.Uint64(rest[:8])
		if n > uint64(len(rest)-12) || uint64(len(rest)-12)-n < 4 {
			return nil, bad("truncated: %d data bytes and 4 CRC bytes declared, %d bytes left", n, len(rest)-12)
		}
		payload := rest[12 : 12+n]
		if got, want := binary.LittleEndian.Uint32(rest[12+n:16+n]), maskedCRC(payload); got != want {
			return nil, bad("data CRC %#08x, want %#08x", got, want)
		}
		msg := dynamicpb.NewMessage(md)
		if err := proto.Unmarshal(payload, msg); err != nil {
			return nil, bad("decode Event: %v", err)
		}
		ev := Event{
			WallTime:    msg.Get(fWall).Float(),
			Step:        msg.Get(fStep).Int(),
			FileVersion: msg.Get(fVersion).String(),
		}
		if msg.Has(fSummary) {
			ev.Values = map[string]float32{}
			list := msg.Get(fSummary).Message().Get(fValue).List()
			for j := 0; j < list.Len(); j++ {
				v := list.Get(j).Message()
				if v.Has(fSimple) {
					ev.Values[v.Get(fTag).String()] = float32(v.Get(fSimple).Float())
				}
			}
		}
		events = append(events, ev)
		off += 16 + int(n)
	}
	return events, nil
}
