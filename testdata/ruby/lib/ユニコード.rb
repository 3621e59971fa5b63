class Ünïcödé
  def método_ñ
    checkpoint
  end
end
