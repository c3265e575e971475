package data

import (
	"fmt"
	"io"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress/zstd"
)

// parquetText is the row WriteParquet writes: one string column, "text", as the Hub's text
// datasets (FineWeb, C4's Parquet conversion) hold their documents.
type parquetText struct {
	Text string `parquet:"text"`
}

// ParquetRowGroup is how many rows WriteParquet puts in a row group.
const ParquetRowGroup = 10000

// WriteParquet writes texts to w as a Parquet file of one string column, "text", zstd-compressed,
// a row group every ParquetRowGroup rows: a file data.format = "parquet" reads, with the
// default data.text_key, as the same documents.
func WriteParquet(w io.Writer, texts []string) error {
	pw := parquet.NewGenericWriter[parquetText](w, parquet.Compression(&zstd.Codec{Level: zstd.SpeedDefault}))
	rows := make([]parquetText, 0, ParquetRowGroup)
	for i, t := range texts {
		rows = append(rows, parquetText{Text: t})
		if len(rows) == ParquetRowGroup || i == len(texts)-1 {
			if _, err := pw.Write(rows); err != nil {
				return fmt.Errorf("data: write parquet: %w", err)
			}
			if err := pw.Flush(); err != nil {
				return fmt.Errorf("data: write parquet: %w", err)
			}
			rows = rows[:0]
		}
	}
	if err := pw.Close(); err != nil {
		return fmt.Errorf("data: write parquet: %w", err)
	}
	return nil
}
