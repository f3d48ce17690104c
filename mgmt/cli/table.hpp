// Plain-text tables for the vcuda command line: columns padded to their widest cell, numbers right-aligned.
#pragma once

#include <string>
#include <vector>

namespace vcuda::cli {

class table {
  public:
    // A column whose name ends in '>' is right-aligned (the '>' is not printed).
    explicit table(std::vector<std::string> columns);
    void add(std::vector<std::string> row);
    std::string render() const;
    bool empty() const { return rows_.empty(); }

  private:
    std::vector<std::string> columns_;
    std::vector<bool> right_;
    std::vector<std::vector<std::string>> rows_;
};

}  // namespace vcuda::cli
