#include "mgmt/cli/table.hpp"

#include <algorithm>

namespace vcuda::cli {

table::table(std::vector<std::string> columns) {
    for (auto& c : columns) {
        bool right = !c.empty() && c.back() == '>';
        if (right) c.pop_back();
        right_.push_back(right);
        columns_.push_back(c);
    }
}

void table::add(std::vector<std::string> row) {
    row.resize(columns_.size());
    rows_.push_back(std::move(row));
}

std::string table::render() const {
    std::vector<size_t> width(columns_.size());
    for (size_t i = 0; i < columns_.size(); ++i) width[i] = columns_[i].size();
    for (auto& r : rows_)
        for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
    std::string out;
    auto line = [&](const std::vector<std::string>& cells) {
        std::string l;
        for (size_t i = 0; i < cells.size(); ++i) {
            size_t pad = width[i] - cells[i].size();
            if (right_[i])
                l.append(pad, ' ').append(cells[i]);
            else
                l.append(cells[i]).append(i + 1 < cells.size() ? pad : 0, ' ');
            if (i + 1 < cells.size()) l.append("  ");
        }
        while (!l.empty() && l.back() == ' ') l.pop_back();
        out += l + "\n";
    };
    line(columns_);
    for (auto& r : rows_) line(r);
    return out;
}

}  // namespace vcuda::cli
